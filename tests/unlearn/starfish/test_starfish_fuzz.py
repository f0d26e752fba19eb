"""The clients service and the servers' side of it, fuzzed: one FedUnlearnError line or a value.

Issue 41: a clients service holding a valid certificate crashed both servers with a 60-line
``ValueError`` by answering ``"rejected": {"²": ...}`` (``str.isdigit()`` accepts "²",
``int()`` refuses it), a key of more than 4,300 digits hit CPython's int-string limit the same
way, and ``int("١٢") == 12`` took Arabic-Indic digits as client ids. Client ids now travel as
JSON integers only and every field is checked by type and range (``deploy.clients``). Each
test drives the real code over an in-memory transport: ``ClientSimulator.serve`` (what the
clients service does with anything two servers send) and ``RemoteClients.exact`` (what a
server does with anything the service answers). The dealer and the hellos:
``tests/mpc/test_message_fuzz.py``.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from starfish_support import FORGET, LR, ROUNDS
from tests.support.peer_fuzz import FUZZ, json_values, one_line

from fedunlearn.errors import (
    MalformedFrameError,
    PeerDisconnectedError,
    SecureComputationError,
)
from fedunlearn.mpc import FixedPoint, Link, SessionBinding
from fedunlearn.mpc.session import Hello
from fedunlearn.unlearn.starfish.deploy.clients import (
    ClientSimulator,
    RemoteClients,
    check_answer,
    remaining_participants,
)

NUM_PARAMS = 4
JSON = json_values(["model", "exact", "bye"])
IDS = st.integers(0, 12) | st.integers(-(2**70), 2**70) | st.sampled_from(["²", "١٢", "3", True])


class Memory:
    """An in-memory transport: ``recv`` returns queued frames, ``send`` records them."""

    def __init__(self, frames=()):
        self.frames = list(frames)
        self.sent = []
        self.wire_bytes_sent = self.wire_bytes_received = 0

    def recv(self, max_bytes):
        if not self.frames:
            raise PeerDisconnectedError("the peer went quiet (no more frames)")
        frame = self.frames.pop(0)
        if frame.nbytes > max_bytes:
            raise MalformedFrameError(f"a frame of {frame.nbytes} bytes; at most {max_bytes}")
        return frame

    def send(self, array):
        self.sent.append(np.array(array))

    def set_timeout(self, seconds):
        pass

    def close(self, linger=0.0):
        pass


def frame_of(doc) -> np.ndarray:
    return np.frombuffer(json.dumps(doc).encode(), dtype=np.uint8).copy()


def link_of(transport, role="clients") -> Link:
    hello = Hello(role, SessionBinding.unbound(), {})
    return Link(transport, role, hello, True, f"{role} at memory")  # type: ignore[arg-type]


# ---- the servers' view: any answer of the clients service -------------------------------------


class Wrap:
    """Stands in for the server's ``Party``: shares stay arrays."""

    @staticmethod
    def tensor(array):
        return array


def ask(answer_frames, ids=(2, 3, 5), round_=4):
    """A server asks for ``ids``; the service answers with ``answer_frames``."""
    gateway = RemoteClients(link_of(Memory(answer_frames)), Wrap(), NUM_PARAMS)
    return gateway.exact(torch.zeros(NUM_PARAMS), list(ids), round_)


@st.composite
def answers(draw) -> dict:
    """A near-valid answer for clients 2, 3, 5 with some part replaced by anything."""
    accepted = draw(st.lists(IDS, max_size=4) | st.just([2, 3]) | JSON)
    rejected = draw(
        st.lists(IDS, max_size=3)
        | st.just([5])
        | st.dictionaries(st.sampled_from(["5", "²", "١٢", "9" * 5_000]), st.text(max_size=9))
        | JSON
    )
    reasons = draw(st.lists(st.text(max_size=30) | JSON, max_size=3) | st.just(["bad"]) | JSON)
    doc = {"accepted": accepted, "rejected": rejected, "reasons": reasons}
    extra = draw(st.dictionaries(st.sampled_from(["error", "x", "reasons"]), JSON, max_size=1))
    return {**doc, **extra}


@FUZZ
@given(answer=answers())
@pytest.mark.slow
def test_any_answer_of_the_clients_service_is_shares_or_one_error_line(answer):
    shares = [np.arange(NUM_PARAMS, dtype=np.uint64)] * 4
    try:
        got, rejected = ask([frame_of(answer), *shares])
    except Exception as exc:  # noqa: BLE001 - judged by one_line
        one_line(exc)
        return
    assert sorted([*got, *rejected]) == [2, 3, 5]
    assert all(type(c) is int for c in [*got, *rejected])
    assert all(isinstance(r, str) and r.isprintable() for r in rejected.values())


@pytest.mark.parametrize(
    ("key", "ids"),
    [("²", [2]), ("١٢", [12]), ("9" * 5_000, [9])],
    ids=["superscript_two", "arabic_indic_twelve", "5000_digits"],
)
def test_a_rejected_client_id_that_is_not_a_json_integer_is_malformed_not_a_crash(key, ids):
    # before: "²" and the 5,000-digit key raised ValueError in both servers (a traceback,
    # exit 1); "١٢" was taken as client 12
    answer = {"accepted": [], "rejected": {key: "wrong shape"}}  # the format before issue 41
    with pytest.raises(MalformedFrameError, match="answered with fields") as caught:
        ask([frame_of(answer)], ids=ids)
    one_line(caught.value)
    answer = {"accepted": [], "rejected": [key], "reasons": ["wrong shape"]}
    with pytest.raises(MalformedFrameError, match="'rejected' that is not a list") as caught:
        ask([frame_of(answer)], ids=ids)
    one_line(caught.value)


def test_a_valid_answer_returns_integer_ids_and_reasons_and_an_error_stops_in_one_line():
    shares = [np.full(NUM_PARAMS, k, dtype=np.uint64) for k in (7, 8)]
    answer = {"accepted": [2, 5], "rejected": [3], "reasons": ["3 non-finite values"]}
    got, rejected = ask([frame_of(answer), *shares])
    assert list(got) == [2, 5]
    assert [int(s[0]) for s in got.values()] == [7, 8]
    assert rejected == {3: "3 non-finite values"}
    with pytest.raises(SecureComputationError, match="refused round 4: server 0 sent a b") as exc:
        ask([frame_of({"error": "server 0 sent\na\n\nb"})])
    one_line(exc.value)
    with pytest.raises(MalformedFrameError, match="not the 3 clients asked for"):
        check_answer({"accepted": [2, 2], "rejected": [3], "reasons": ["x"]}, [2, 3, 5], "c", 4)
    with pytest.raises(MalformedFrameError, match="'reasons'"):
        check_answer({"accepted": [2, 5], "rejected": [3], "reasons": []}, [2, 3, 5], "c", 4)


# ---- the service's view: anything two servers send ---------------------------------------------


@pytest.fixture(scope="module")
def simulator_parts(session):
    context = session.context(FORGET)
    remaining = set(context.clients.client_ids)
    return context, remaining_participants(session.run_view.store, remaining, ROUNDS)


def simulator(parts) -> ClientSimulator:
    context, participants = parts
    return ClientSimulator(
        context.clients,
        -1.0 / LR,
        FixedPoint(16),
        context.initial_params.dtype,
        initial_model=context.initial_params,
        participants=participants,
        max_models=math.ceil(0.6 * ROUNDS) + 1,
    )


@st.composite
def requests(draw) -> dict:
    """A near-valid request of each operation, with fields replaced, added or dropped."""
    op = draw(st.sampled_from(["model", "exact", "bye", "other"]))
    doc: dict = {"op": op if op != "other" else draw(JSON)}
    if op in ("model", "exact"):
        doc["model" if op == "exact" else "digest"] = draw(
            st.sampled_from(["0" * 64, "A" * 64, "0" * 63]) | JSON
        )
    if op == "exact":
        doc["round"] = draw(st.integers(0, ROUNDS + 1) | IDS | JSON)
        doc["clients"] = draw(st.lists(IDS, max_size=4) | JSON)
    for key in draw(st.lists(st.sampled_from(["op", "round", "clients", "digest"]), max_size=1)):
        if draw(st.booleans()):
            doc.pop(key, None)
        else:
            doc[key] = draw(JSON)
    return doc


def frames_of(doc) -> list[np.ndarray]:
    """A request's frames: its JSON, and for a model announcement some array."""
    frames = [frame_of(doc)]
    if doc.get("op") == "model":
        frames.append(np.zeros(NUM_PARAMS, dtype=np.float64))
    return frames


@FUZZ
@given(docs=st.lists(requests(), min_size=1, max_size=3), differ=st.booleans())
@pytest.mark.slow
def test_anything_two_servers_send_is_answered_or_stops_both_with_one_line(
    simulator_parts, docs, differ
):
    # both servers send the same messages (so they pass the equality check and reach every
    # later check), or server 1 sends only the first one
    mine = [f for doc in docs for f in frames_of(doc)]
    theirs = mine if not differ else frames_of(docs[0])
    servers = {"server0": Memory(mine), "server1": Memory(theirs)}
    service = simulator(simulator_parts)
    try:
        service.serve({role: link_of(t, role) for role, t in servers.items()})
    except Exception as exc:  # noqa: BLE001 - judged by one_line
        one_line(exc)
        # both servers were told why, in a message they accept as the service's refusal
        for transport in servers.values():
            told = json.loads(transport.sent[-1].tobytes())
            with pytest.raises(SecureComputationError):
                check_answer(told, [1], "clients", 1)


def test_a_request_with_a_unicode_digit_round_or_extra_fields_is_malformed(simulator_parts):
    for doc in (
        {"op": "exact", "round": "١", "clients": [2], "model": "0" * 64},
        {"op": "exact", "round": 1, "clients": ["²"], "model": "0" * 64},
        {"op": "exact", "round": 1, "clients": [2], "model": "0" * 64, "x": 1},
        {"op": "model", "digest": 7},
    ):
        servers = {"server0": Memory(frames_of(doc)), "server1": Memory(frames_of(doc))}
        with pytest.raises(MalformedFrameError) as caught:
            simulator(simulator_parts).serve(
                {role: link_of(t, role) for role, t in servers.items()}
            )
        one_line(caught.value)
