"""The dealer's wire format: the messages a server and the dealer exchange, and their limits.

**Requests** (uint64 word frames, party to dealer):

- request k: ``[2, k, kind, frac_bits, number of shapes, (ndim, dims...)...]``. The dealer waits
  for request k from *both* parties, checks they match and replies ``[10, k]``, then the seed
  (uint8, 16 bytes) and, to party 1 for kinds with derived values, the corrections (uint64).
- plan: ``[4, plan_id, first, count, (kind, frac_bits, number of shapes, (ndim, dims...)...)...]``
  declares the next ``count`` requests (``DealerClient.plan``). Once both parties declared the
  same plan, a producer thread derives the material request by request and streams it to both,
  ``[11, plan_id, k]`` then seed (and corrections), ahead of use, then ``[12, plan_id, next]``.
  The parties consume it without a message to the dealer (the offline phase proper); streams
  are bounded (the dealer's ``stream_buffer_bytes``, the party's ``prefetch_bytes``: TCP
  backpressure pauses the producer).
- abandon: ``[5, plan_id, k]``: a party's request k is not the planned one. The producer stops,
  ends the stream with ``[12, plan_id, k]``, and request k onwards are served on demand. Material
  already streamed for the abandoned part is never derived again (a new ``epoch`` enters the
  seed labels), so nothing is ever used twice.
- goodbye: ``[3, k]``. The dealer exits cleanly once both said goodbye.

Every party message is paired with the other party's and must equal it (same kind, index,
request or plan); a mismatch ends the session with ``SecureComputationError`` at both parties,
never with wrong randomness. Errors reach a party as an int64 frame ``[code]`` and a uint8
message: 1 mismatch (``SecureComputationError``), 2 malformed (``MalformedFrameError``),
3 the other party is gone (``PeerDisconnectedError``). A dealer that dies or stays silent past
the timeout makes ``RemoteDealer`` raise ``PeerDisconnectedError``.

What each party receives: party 0 only 16-byte seeds (material derived from them), party 1 its
own seeds plus one correction share per derived value; ZeroGen is the one request whose seed
both receive. Dealer material is charged to the party's counters exactly as the simulated
``Dealer`` charges it (offline phase, 16 bytes per request plus corrections for party 1); the
link's own frames (requests, plans, headers) are counted on ``RemoteDealer.transport``.

The offline phase: docs/mpc.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedunlearn.errors import MalformedFrameError, PeerDisconnectedError, SecureComputationError
from fedunlearn.mpc.dealer import KINDS, Request

__all__ = [
    "ABANDON",
    "BYE",
    "END",
    "ERRORS",
    "GONE",
    "MALFORMED",
    "MATERIAL",
    "MAX_ERROR_TEXT",
    "MAX_HEADER_BYTES",
    "MAX_MESSAGE_BYTES",
    "MAX_PLAN_REQUESTS",
    "MISMATCH",
    "PLAN",
    "PROTOCOL_VERSION",
    "REPLY",
    "REQUEST",
    "U64",
    "Message",
    "decode",
    "decode_or_error",
    "encode_plan",
    "encode_request",
    "material_bytes",
]

PROTOCOL_VERSION = 2
REQUEST, BYE, PLAN, ABANDON = 2, 3, 4, 5  # server to dealer
REPLY, MATERIAL, END = 10, 11, 12  # dealer to server (headers)
MISMATCH, MALFORMED, GONE = 1, 2, 3  # error codes
ERRORS: dict[int, type[Exception]] = {
    MISMATCH: SecureComputationError,
    MALFORMED: MalformedFrameError,
    GONE: PeerDisconnectedError,
}
MAX_PLAN_REQUESTS = 100_000
MAX_MESSAGE_BYTES = 8 << 20  # a party's largest message: a plan of many requests
MAX_HEADER_BYTES = 64
MAX_ERROR_TEXT = 64 * 1024
U64 = np.dtype("<u8")


def request_words(request: Request) -> list[int]:
    """A request as words: kind, frac_bits, number of shapes, then (ndim, dims...) each."""
    words = [KINDS.index(request.kind), request.frac_bits, len(request.shapes)]
    for shape in request.shapes:
        words += [len(shape), *shape]
    return words


def encode_request(index: int, request: Request) -> np.ndarray:
    """The frame of on-demand request ``index``."""
    return np.array([REQUEST, index, *request_words(request)], dtype=np.uint64)


def encode_plan(plan_id: int, first: int, requests: Sequence[Request]) -> np.ndarray:
    """The frame declaring ``requests`` as the next ones, from index ``first``."""
    words = [PLAN, plan_id, first, len(requests)]
    for request in requests:
        words += request_words(request)
    return np.array(words, dtype=np.uint64)


@dataclass(frozen=True)
class Message:
    """A decoded party message; two parties' messages must be equal to be served."""

    kind: str  # "request", "plan", "abandon", "bye"
    index: int
    request: Request | None = None
    plan_id: int = 0
    plan: tuple[Request, ...] = ()

    def __str__(self) -> str:
        if self.kind == "request":
            return f"asked for #{self.index}: {self.request}"
        if self.kind == "plan":
            return f"declared plan {self.plan_id} of {len(self.plan)} requests from #{self.index}"
        if self.kind == "abandon":
            return f"gave up plan {self.plan_id} at #{self.index}"
        return f"ended its session after {self.index} requests"


def parse_request(words: list[int], pos: int) -> tuple[Request, int]:
    """Parse (kind, frac_bits, count, shapes...) at ``pos``; ValueError if inconsistent."""
    if pos + 3 > len(words):
        raise ValueError("truncated request")
    kind, frac_bits, count = words[pos : pos + 3]
    pos += 3
    if kind >= len(KINDS) or frac_bits > 40 or count > 3:
        raise ValueError(f"kind {kind}, frac_bits {frac_bits}, {count} shapes")
    shapes = []
    for _ in range(count):
        if pos >= len(words) or words[pos] > 8 or pos + 1 + words[pos] > len(words):
            raise ValueError("truncated or oversized shape")
        ndim = words[pos]
        shapes.append(tuple(words[pos + 1 : pos + 1 + ndim]))
        pos += 1 + ndim
    return Request(KINDS[kind], tuple(shapes), frac_bits), pos


def decode(frame: np.ndarray, party_id: int) -> Message:
    """Parse one party message; ``MalformedFrameError`` if it is not a valid one."""
    words = [int(w) for w in frame.reshape(-1)] if frame.dtype == np.uint64 else []
    problem = f"a {frame.dtype} frame of shape {frame.shape} (expected uint64 words)"
    try:
        if len(words) == 2 and words[0] == BYE:
            return Message("bye", words[1])
        if len(words) == 3 and words[0] == ABANDON:
            return Message("abandon", words[2], plan_id=words[1])
        if len(words) >= 5 and words[0] == REQUEST:
            request, end = parse_request(words, 2)
            if end == len(words):
                return Message("request", words[1], request)
            problem = f"a request with {len(words) - end} trailing words"
        elif len(words) >= 4 and words[0] == PLAN:
            plan_id, first, count = words[1:4]
            if count > MAX_PLAN_REQUESTS:
                raise ValueError(f"{count} requests (at most {MAX_PLAN_REQUESTS})")
            requests, pos = [], 4
            for _ in range(count):
                request, pos = parse_request(words, pos)
                requests.append(request)
            if pos == len(words):
                return Message("plan", first, plan_id=plan_id, plan=tuple(requests))
            problem = f"a plan with {len(words) - pos} trailing words"
        elif words:
            problem = f"message tag {words[0]} (expected request, plan, abandon or goodbye)"
    except ValueError as exc:
        problem = f"an invalid message {words[:16]} ({exc})"
    raise MalformedFrameError(f"party {party_id} sent the dealer {problem}")


def decode_or_error(frame: np.ndarray, party_id: int) -> Message | MalformedFrameError:
    """Decode in the I/O thread; a bad message becomes an item (the link stays usable)."""
    try:
        return decode(frame, party_id)
    except MalformedFrameError as exc:
        return exc


def material_bytes(request: Request) -> int:
    """Bytes of material one request asks for (both expansions; the dealer's size cap)."""
    shapes = request.random_shapes + request.correction_shapes
    return 8 * sum(math.prod(s) for s in shapes)
