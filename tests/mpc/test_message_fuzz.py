"""Every message a peer sends in the mpc layer, fuzzed: one FedUnlearnError line or a value.

Issue 41: a peer holding a valid certificate must not be able to crash another process with a
message: whatever it sends, the receiver either accepts a valid message or raises one of the
library's errors (one line, exit 2 through the CLI), never a ``ValueError``, ``KeyError`` or
``ZeroDivisionError`` traceback. Covered here: hellos and ready messages (every link), the
dealer's view of a server's requests, plans, abandons and goodbyes (``dealer_wire.decode``,
then the material it derives for what it accepted), and a server's view of the dealer's
headers, seeds, corrections and errors (``RemoteDealer._on_frame``). The clients service and
the servers' view of it: ``tests/unlearn/starfish/test_starfish_fuzz.py``.
"""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.support.peer_fuzz import FUZZ, json_values, one_line

from fedunlearn.errors import FedUnlearnError, MalformedFrameError
from fedunlearn.mpc import Link, TcpTransport
from fedunlearn.mpc.dealer import KINDS, Request, deal, expand
from fedunlearn.mpc.dealer_wire import (
    ABANDON,
    BYE,
    END,
    MATERIAL,
    PLAN,
    REPLY,
    REQUEST,
    decode,
    material_bytes,
)
from fedunlearn.mpc.link import check_ready
from fedunlearn.mpc.remote_dealer import RemoteDealer
from fedunlearn.mpc.session import Hello, SessionBinding, decode_message

SMALL_MATERIAL = 1 << 16  # derive material for accepted requests up to this many bytes
JSON = json_values(["server0", "dealer", "fedunlearn-mpc"])


def as_frame(doc) -> np.ndarray:
    data = json.dumps(doc).encode()
    return np.frombuffer(data, dtype=np.uint8).copy()


def a_hello(role="server1", session="s", options=None, digests=None) -> dict:
    binding = SessionBinding(session, digests or {"job": "ab" * 32})
    return Hello(role, binding, options or {"frac_bits": 16}).to_json()


HELLO_FIELDS = ("protocol", "version", "role", "session", "digests", "options")


# ---- hellos and ready messages (every link) ----------------------------------------------------


@FUZZ
@given(
    field=st.sampled_from(HELLO_FIELDS),
    value=JSON,
    extra=st.dictionaries(st.text(max_size=8), JSON, max_size=3),
)
def test_a_hello_with_any_field_replaced_parses_or_is_one_malformed_line(field, value, extra):
    doc = {**a_hello(), **extra, field: value}
    try:
        hello = Hello.parse(decode_message(as_frame(doc), "server1 at 127.0.0.1:9"), "server1")
    except Exception as exc:  # noqa: BLE001 - judged by one_line
        one_line(exc)
        return
    assert isinstance(hello.role, str)
    assert isinstance(hello.binding, SessionBinding)
    assert all(isinstance(v, int | float | str | bool) for v in hello.options.values())


@FUZZ
@given(
    doc=st.dictionaries(st.text(max_size=8), JSON, max_size=4)
    | st.builds(dict, ready=JSON)
    | st.builds(dict, abort=JSON)
)
def test_a_ready_message_of_any_content_is_ready_or_one_error_line(doc):
    try:
        check_ready(decode_message(as_frame(doc), "the dealer"), "the dealer")
    except Exception as exc:  # noqa: BLE001 - judged by one_line
        one_line(exc)
        return
    assert doc.get("ready") is True
    assert "abort" not in doc


@FUZZ
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes_where_a_hello_belongs_are_one_malformed_line(data):
    with pytest.raises(FedUnlearnError) as caught:
        Hello.parse(decode_message(np.frombuffer(data, dtype=np.uint8).copy(), "p"), "p")
    one_line(caught.value)


# ---- what a server sends the dealer ------------------------------------------------------------

WORD = st.integers(0, 12) | st.integers(0, (1 << 64) - 1)
SHAPE = st.lists(st.integers(0, 6), max_size=3)


@st.composite
def request_words(draw) -> list[int]:
    """A request as words: mostly well-formed kinds and shapes, sometimes anything."""
    if draw(st.booleans()):
        return draw(st.lists(WORD, max_size=8))
    shapes = draw(st.lists(SHAPE, min_size=0, max_size=3))
    words = [draw(st.integers(0, len(KINDS))), draw(st.integers(0, 41)), len(shapes)]
    for shape in shapes:
        words += [len(shape), *shape]
    return words


@st.composite
def party_message(draw) -> np.ndarray:
    tag = draw(st.sampled_from([REQUEST, PLAN, ABANDON, BYE, 0, 7, 11]))
    if tag == REQUEST:
        words = [tag, draw(WORD), *draw(request_words())]
    elif tag == PLAN:
        parts = draw(st.lists(request_words(), max_size=3))
        count = draw(st.sampled_from([len(parts), len(parts) + 1, 1 << 40]))
        words = [tag, draw(WORD), draw(WORD), count, *(w for p in parts for w in p)]
    else:
        words = [tag, *draw(st.lists(WORD, max_size=3))]
    dtype = draw(st.sampled_from([np.uint64, np.uint64, np.uint64, np.int64, np.uint8]))
    return np.array(words, dtype=np.uint64).astype(dtype)


def serve_everything(request: Request) -> None:
    """The dealer's work for an accepted request, and both parties' expansion of it."""
    if material_bytes(request) > SMALL_MATERIAL:
        return
    seeds = (b"\x01" * 16, b"\x02" * 16, b"\x03" * 16)
    corrections = deal(request, *seeds, mask_scale_bits=2)
    assert [c.shape for c in corrections] == request.correction_shapes
    expand(request, 0, seeds[0])
    expand(request, 1, seeds[1], corrections)


@FUZZ
@given(frame=party_message())
def test_any_party_message_is_a_valid_message_the_dealer_can_serve_or_one_malformed_line(frame):
    try:
        message = decode(frame, 1)
    except Exception as exc:  # noqa: BLE001 - judged by one_line
        assert isinstance(exc, MalformedFrameError), repr(exc)
        one_line(exc)
        return
    requests = [message.request] if message.request is not None else list(message.plan)
    for request in requests:
        try:
            serve_everything(request)
        except Exception as exc:  # noqa: BLE001 - e.g. a mask the ring cannot hold
            one_line(exc)


def test_a_mask_request_of_empty_matrices_is_malformed_not_a_zero_division():
    # before: decode accepted mask (0, 0) and the dealer's _mask divided by sqrt(0)
    frame = np.array([REQUEST, 0, KINDS.index("mask"), 16, 1, 2, 0, 0], dtype=np.uint64)
    with pytest.raises(MalformedFrameError, match="mask"):
        decode(frame, 0)


# ---- what the dealer sends a server ------------------------------------------------------------


@pytest.fixture
def remote():
    """A dealer client on a socketpair (nothing is sent on it: frames go to ``_on_frame``)."""
    ours, theirs = socket.socketpair()
    hello = Hello("dealer", SessionBinding.unbound(), {})
    link = Link(TcpTransport(ours, 1, 5.0), "dealer", hello, True, "dealer at test")
    client = RemoteDealer(link, 1, timeout_seconds=5.0)
    yield client
    client.close(goodbye=False)
    theirs.close()


STATES = ("ready", "header", "seed", "corrections", "error")


def fits(frame: np.ndarray, expect) -> bool:
    """Whether the transport hands ``frame`` on where ``expect`` is what the receiver wants."""
    return (
        frame.nbytes <= expect.max_bytes
        and (expect.dtype is None or frame.dtype == expect.dtype)
        and (expect.shape is None or frame.shape == expect.shape)
    )


@st.composite
def dealer_frame(draw) -> np.ndarray:
    kind = draw(st.sampled_from(["header", "bytes", "int64", "seed", "words"]))
    if kind == "bytes":
        return np.frombuffer(draw(st.binary(max_size=64)), dtype=np.uint8).copy()
    if kind == "seed":
        return np.frombuffer(draw(st.binary(min_size=16, max_size=16)), dtype=np.uint8).copy()
    if kind == "words":
        return np.array(draw(st.lists(WORD, min_size=3, max_size=3)), dtype=np.uint64)
    if kind == "int64":
        return np.array(draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=2)), np.int64)
    tag = draw(st.sampled_from([REPLY, MATERIAL, END, 0, 99]))
    return np.array([tag, *draw(st.lists(WORD, max_size=3))], dtype=np.uint64)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(state=st.sampled_from(STATES), frames=st.lists(dealer_frame(), min_size=1, max_size=4))
def test_any_dealer_frame_is_taken_or_one_error_line(remote, state, frames):
    # white box: the I/O thread's frame handler, from each of its states
    request = Request("triple", ((3,),))
    remote._state, remote._error_code = state, 1
    remote._outstanding = {0: request, 5: Request("mask", ((2, 2),), 16)}
    remote._pending = ("reply", 0, 0, request) if state in ("seed", "corrections") else None
    remote._plans, remote._seed = {}, b"\x05" * 16
    for frame in frames:
        expect = remote._expect_next()
        if not fits(frame, expect):  # the transport refuses it before the handler sees it
            return
        try:
            remote._on_frame(frame)
        except Exception as exc:  # noqa: BLE001 - judged by one_line
            one_line(exc)
            return
