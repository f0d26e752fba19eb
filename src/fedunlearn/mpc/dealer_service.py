"""The dealer as its own process: a TCP ``DealerServer`` and the parties' ``RemoteDealer``.

The dealer is a trusted third party, so it runs apart from both servers and holds the master
secret alone (``secrets``, or a seed for tests). It serves one session:

**Joining** (``link.accept_peers``). The dealer keeps accepting until the authenticated
``server0`` and ``server1`` have joined, each exactly once; junk connections, other roles
(a ``clients`` certificate claiming a server) and second claims of a role are refused and
logged, never served. Each server's hello carries its session binding (``binding.for_dealer()``:
session id and one job digest) and ``mask_scale_bits``; the two must agree with each other
(and with the dealer's own binding, if it was given one), or both servers get a
``SessionMismatchError`` naming the differing fields and the dealer stops. Then each server
receives ``{"ready": true}``.

**Requests** (uint64 word frames, party to dealer):

- request k: ``[2, k, kind, frac_bits, number of shapes, (ndim, dims...)...]``. The dealer waits
  for request k from *both* parties, checks they match and replies ``[10, k]``, then the seed
  (uint8, 16 bytes) and, to party 1 for kinds with derived values, the corrections (uint64).
- plan: ``[4, plan_id, first, count, (kind, frac_bits, number of shapes, (ndim, dims...)...)...]``
  declares the next ``count`` requests (``DealerClient.plan``). Once both parties declared the
  same plan, a producer thread derives the material request by request and streams it to both,
  ``[11, plan_id, k]`` then seed (and corrections), ahead of use, then ``[12, plan_id, next]``.
  The parties consume it without a message to the dealer (the offline phase proper); streams
  are bounded (``stream_buffer_bytes`` here, ``prefetch_bytes`` at the party: TCP backpressure
  pauses the producer).
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

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Sec. III (two non-colluding servers, a trusted dealer, offline material); docs/security.md
(what the dealer learns), docs/performance.md (the offline phase measured).
"""

from __future__ import annotations

import math
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedunlearn.errors import (
    ConfigError,
    FedUnlearnError,
    MalformedFrameError,
    PeerDisconnectedError,
    SecureComputationError,
)
from fedunlearn.mpc.channel import Channel
from fedunlearn.mpc.dealer import (
    KINDS,
    DealerClient,
    Request,
    deal,
    expand,
    master_seed,
    request_seeds,
)
from fedunlearn.mpc.identity import Identity, party_role
from fedunlearn.mpc.link import Link, LinkSecurity, accept_peers, check_ready, connect_peer
from fedunlearn.mpc.prg import SEED_BYTES, fresh_seed
from fedunlearn.mpc.session import MAX_HELLO_BYTES, SessionBinding, decode_message
from fedunlearn.mpc.tcp import DEFAULT_MAX_FRAME_BYTES, Expect, TcpListener, TcpTransport
from fedunlearn.mpc.transport import Counters

__all__ = [
    "DEFAULT_PREFETCH_BYTES",
    "MAX_PLAN_REQUESTS",
    "PROTOCOL_VERSION",
    "DealerServer",
    "RemoteDealer",
]

PROTOCOL_VERSION = 2
_REQUEST, _BYE, _PLAN, _ABANDON = 2, 3, 4, 5
_REPLY, _MATERIAL, _END = 10, 11, 12
_MISMATCH, _MALFORMED, _GONE = 1, 2, 3
_ERRORS: dict[int, type[Exception]] = {
    _MISMATCH: SecureComputationError,
    _MALFORMED: MalformedFrameError,
    _GONE: PeerDisconnectedError,
}
MAX_PLAN_REQUESTS = 100_000
DEFAULT_PREFETCH_BYTES = 2 << 30
_MAX_MESSAGE_BYTES = 8 << 20  # a party's largest message: a plan of many requests
_MAX_HEADER_BYTES = 64
_MAX_ERROR_TEXT = 64 * 1024
_U64 = np.dtype("<u8")


# ---- wire format of party messages ------------------------------------------------------------


def _request_words(request: Request) -> list[int]:
    words = [KINDS.index(request.kind), request.frac_bits, len(request.shapes)]
    for shape in request.shapes:
        words += [len(shape), *shape]
    return words


def _encode_request(index: int, request: Request) -> np.ndarray:
    return np.array([_REQUEST, index, *_request_words(request)], dtype=np.uint64)


def _encode_plan(plan_id: int, first: int, requests: Sequence[Request]) -> np.ndarray:
    words = [_PLAN, plan_id, first, len(requests)]
    for request in requests:
        words += _request_words(request)
    return np.array(words, dtype=np.uint64)


@dataclass(frozen=True)
class _Message:
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


def _parse_request(words: list[int], pos: int) -> tuple[Request, int]:
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


def _decode(frame: np.ndarray, party_id: int) -> _Message:
    """Parse one party message; ``MalformedFrameError`` if it is not a valid one."""
    words = [int(w) for w in frame.reshape(-1)] if frame.dtype == np.uint64 else []
    problem = f"a {frame.dtype} frame of shape {frame.shape} (expected uint64 words)"
    try:
        if len(words) == 2 and words[0] == _BYE:
            return _Message("bye", words[1])
        if len(words) == 3 and words[0] == _ABANDON:
            return _Message("abandon", words[2], plan_id=words[1])
        if len(words) >= 5 and words[0] == _REQUEST:
            request, end = _parse_request(words, 2)
            if end == len(words):
                return _Message("request", words[1], request)
            problem = f"a request with {len(words) - end} trailing words"
        elif len(words) >= 4 and words[0] == _PLAN:
            plan_id, first, count = words[1:4]
            if count > MAX_PLAN_REQUESTS:
                raise ValueError(f"{count} requests (at most {MAX_PLAN_REQUESTS})")
            requests, pos = [], 4
            for _ in range(count):
                request, pos = _parse_request(words, pos)
                requests.append(request)
            if pos == len(words):
                return _Message("plan", first, plan_id=plan_id, plan=tuple(requests))
            problem = f"a plan with {len(words) - pos} trailing words"
        elif words:
            problem = f"message tag {words[0]} (expected request, plan, abandon or goodbye)"
    except ValueError as exc:
        problem = f"an invalid message {words[:16]} ({exc})"
    raise MalformedFrameError(f"party {party_id} sent the dealer {problem}")


def _decode_or_error(frame: np.ndarray, party_id: int) -> _Message | MalformedFrameError:
    """Decode in the I/O thread; a bad message becomes an item (the link stays usable)."""
    try:
        return _decode(frame, party_id)
    except MalformedFrameError as exc:
        return exc


def _material_bytes(request: Request) -> int:
    shapes = request.random_shapes + request.correction_shapes
    return 8 * sum(math.prod(s) for s in shapes)


# ---- the dealer ---------------------------------------------------------------------------


class DealerServer:
    """The dealer process's server: accept both servers, then serve paired requests and plans.

    Args:
        host: Address to bind (``127.0.0.1`` for loopback).
        port: Port, or 0 for an ephemeral one (read it back from ``.port``).
        seed: Master seed (int or bytes) for reproducible tests; None draws a fresh secret
            from the operating system (``secrets``), which never leaves this process.
        mask_scale_bits: k of invertible masks; both parties must announce the same.
        identity: The dealer's TLS identity (role ``dealer``): mutual TLS, servers' roles
            from their certificates. The secure setting.
        insecure: Plain TCP, chosen explicitly (``identity.INSECURE_WARNING``).
        binding: The session's binding as the dealer sees it (``SessionBinding.for_dealer``);
            None: the servers' bindings must only agree with each other.
        ssl_context: Legacy server-side TLS context (roles claimed in hellos, not certified).
            With none of ``identity``, ``insecure`` and ``ssl_context`` the dealer runs plain
            TCP as older callers expect (``legacy_plain``); new callers pass one explicitly.
        timeout_seconds: How long the second message of a pair, or a send, may take.
        idle_timeout_seconds: How long to wait for the first message of a pair (the servers
            may compute locally for a long time in between).
        accept_timeout_seconds: How long to wait for both servers to join (default: idle).
        handshake_timeout_seconds: Bound on one connection's TLS handshake and hello.
        max_frame_bytes: Largest amount of material one request may ask for.
        stream_buffer_bytes: Material queued per party before the producer waits for it to
            be read.
        listen_socket: An already listening socket to serve on instead of binding
            ``host:port`` (a launcher that binds ephemeral ports itself hands it over).

    Attributes:
        requests: Requests served so far (on demand or streamed).
        sent_bytes: Payload bytes sent to party 0 and party 1 (seeds, corrections, headers).
        security: How the links are secured (one line). Refused connections are logged
            (logger ``fedunlearn.mpc.link``).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        seed: int | bytes | None = None,
        mask_scale_bits: int = 2,
        identity: Identity | None = None,
        insecure: bool | None = None,
        binding: SessionBinding | None = None,
        ssl_context: ssl.SSLContext | None = None,
        timeout_seconds: float = 60.0,
        idle_timeout_seconds: float = 3600.0,
        accept_timeout_seconds: float | None = None,
        handshake_timeout_seconds: float = 10.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        stream_buffer_bytes: int = 256 << 20,
        listen_socket: socket.socket | None = None,
    ) -> None:
        self.legacy_plain = identity is None and ssl_context is None and insecure is None
        self._security = LinkSecurity.of(
            identity, bool(insecure) or self.legacy_plain, ssl_context, what="the dealer"
        )
        if identity is not None and identity.role != "dealer":
            raise ConfigError(f"the dealer needs a 'dealer' certificate; got {identity.role!r}")
        self._listener = TcpListener(host, port, sock=listen_socket)
        self.host, self.port = self._listener.host, self._listener.port
        self._master = fresh_seed() if seed is None else master_seed(seed)
        self.mask_scale_bits = int(mask_scale_bits)
        self.binding = None if binding is None else binding.for_dealer()
        self.timeout_seconds = float(timeout_seconds)
        self.idle_timeout_seconds = float(idle_timeout_seconds)
        self.accept_timeout_seconds = float(
            idle_timeout_seconds if accept_timeout_seconds is None else accept_timeout_seconds
        )
        self.handshake_timeout_seconds = float(handshake_timeout_seconds)
        self.max_frame_bytes = int(max_frame_bytes)
        self.stream_buffer_bytes = int(stream_buffer_bytes)
        self.requests = 0
        self.sent_bytes = [0, 0]
        self.security = self._security.describe() + (
            " [implicit: pass insecure=True]" if self.legacy_plain else ""
        )
        self._channels: list[Channel | None] = [None, None]
        self._epoch = 0
        self._producer: threading.Thread | None = None
        self._stop = threading.Event()
        self._producer_error: BaseException | None = None
        self._plan_id = -1

    def __repr__(self) -> str:  # never prints the master secret
        return f"DealerServer(address={self.host}:{self.port}, requests={self.requests})"

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the parties connect to."""
        return self.host, self.port

    def serve(self) -> int:
        """Accept both servers and serve their requests and plans until both say goodbye.

        Returns:
            The number of requests served.

        Raises:
            PeerDisconnectedError: A server did not join in time, disconnected or stayed
                silent past the timeout (the other server is told before the dealer stops).
            SessionMismatchError: The servers run different sessions or jobs (both told).
            SecureComputationError: The parties' requests did not match (both are told).
            MalformedFrameError: A party sent something that is not a valid message.
        """
        try:
            self._accept()
            while True:
                first = self._read(0, self.idle_timeout_seconds)
                if first.kind == "abandon":
                    self._stop.set()  # stop producing at once; the pair is checked below
                second = self._read(1, self.timeout_seconds)
                self._check_pair(first, second)
                self._join_producer()
                if first.kind == "bye":
                    return self.requests
                if first.kind == "request" and first.request is not None:
                    self._serve(first.request)
                elif first.kind == "plan":
                    self._start_plan(first)
                else:  # abandon: continue on demand from the party's index, in a new epoch
                    self._epoch += 1
                    self.requests = first.index
        finally:
            self.close()

    def close(self) -> None:
        """Stop the producer, flush pending error messages, close both links, stop listening."""
        self._stop.set()
        if self._producer is not None:
            self._producer.join(10.0)
        for channel in self._channels:
            if channel is not None:
                channel.close(flush_seconds=2.0)
        self._listener.close()

    # ---- joining -----------------------------------------------------------------------------

    def _accept(self) -> None:
        security = self._security
        links = accept_peers(
            self._listener,
            role="dealer",
            peer_roles={"server0", "server1"},
            binding=self.binding,
            adopt_binding=self.binding is None,
            options={"mask_scale_bits": self.mask_scale_bits},
            identity=security.identity,
            insecure=security.identity is None and security.legacy_context is None,
            ssl_context=security.legacy_context,
            timeout_seconds=self.timeout_seconds,
            accept_timeout_seconds=self.accept_timeout_seconds,
            handshake_timeout_seconds=self.handshake_timeout_seconds,
            max_frame_bytes=_MAX_MESSAGE_BYTES,
        )
        self._listener.close()  # each role is served once: nobody else may join
        for party_id in (0, 1):
            link = links[party_role(party_id)]
            self._channels[party_id] = Channel(
                link.transport,
                expect=lambda: Expect(_MAX_MESSAGE_BYTES, _U64),
                on_frame=lambda array, k=party_id: (_decode_or_error(array, k), array.nbytes),
                max_buffered_bytes=64 << 20,
                write_timeout_seconds=self.idle_timeout_seconds,
                name=f"dealer-party{party_id}",
            )

    # ---- pairing -----------------------------------------------------------------------------

    def _channel(self, party_id: int) -> Channel:
        channel = self._channels[party_id]
        if channel is None:
            raise PeerDisconnectedError(f"party {party_id} is not connected to the dealer")
        return channel

    def _read(self, party_id: int, timeout_seconds: float) -> _Message:
        """Read party ``party_id``'s next message; tell the other party if this fails."""
        try:
            item = self._channel(party_id).receive(timeout_seconds)
            if isinstance(item, MalformedFrameError):
                raise item
            return item
        except MalformedFrameError as exc:
            self._tell(party_id, _MALFORMED, str(exc))
            self._tell(1 - party_id, _GONE, f"the dealer ended the session: {exc}")
            raise
        except FedUnlearnError as exc:
            message = f"the dealer lost party {party_id} ({exc}); the session is over"
            self._tell(1 - party_id, _GONE, message)
            raise PeerDisconnectedError(message) from exc

    def _check_pair(self, first: _Message, second: _Message) -> None:
        expected = self.requests
        if first == second:
            if first.kind in ("request", "plan") and first.index == expected:
                return
            if first.kind == "bye":  # a plan may end unused
                return
            if first.kind == "abandon" and first.plan_id == self._plan_id:
                return
        message = (
            f"dealer requests do not match at request #{expected}: party 0 {first}, party 1 "
            f"{second}. Both parties must make the same dealer requests and plans in the same "
            "order (run the same program on inputs of the same shapes)."
        )
        for party_id, got in enumerate((first, second)):
            if got.kind != "bye":  # a party that said goodbye has closed its end
                self._tell(party_id, _MISMATCH, message)
        raise SecureComputationError(message)

    # ---- serving -----------------------------------------------------------------------------

    def _check_size(self, request: Request, index: int) -> None:
        needed = _material_bytes(request)
        if needed > self.max_frame_bytes:
            message = (
                f"request #{index} ({request}) needs {needed} bytes of material; this dealer "
                f"allows at most {self.max_frame_bytes} (max_frame_bytes) per request"
            )
            for party_id in (0, 1):
                self._tell(party_id, _MALFORMED, message)
            raise MalformedFrameError(message)

    def _material(self, index: int, request: Request) -> tuple[bytes, bytes, list[np.ndarray]]:
        s0, s1, private = request_seeds(self._master, index, request, self._epoch)
        corrections = deal(request, s0, s1, private, self.mask_scale_bits)
        return s0, s1, corrections

    def _send_material(
        self, header: list[int], s0: bytes, s1: bytes, corrections: list[np.ndarray]
    ) -> None:
        head = np.array(header, dtype=np.uint64)
        self._send(0, head)
        self._send(0, np.frombuffer(s0, dtype=np.uint8))  # party 0: the seed, nothing else
        self._send(1, head)
        self._send(1, np.frombuffer(s1, dtype=np.uint8))
        if corrections:
            self._send(1, np.concatenate([c.reshape(-1) for c in corrections]))

    def _serve(self, request: Request) -> None:
        self._check_size(request, self.requests)
        s0, s1, corrections = self._material(self.requests, request)
        self._send_material([_REPLY, self.requests], s0, s1, corrections)
        self.requests += 1

    def _start_plan(self, message: _Message) -> None:
        for offset, request in enumerate(message.plan):
            self._check_size(request, message.index + offset)
        first, plan_id = message.index, message.plan_id
        self._plan_id = plan_id
        self.requests = first + len(message.plan)
        self._stop.clear()
        self._producer_error = None
        self._producer = threading.Thread(
            target=self._produce,
            args=(plan_id, first, message.plan, self._epoch),
            name="dealer-producer",
            daemon=True,
        )
        self._producer.start()

    def _produce(self, plan_id: int, first: int, plan: tuple[Request, ...], epoch: int) -> None:
        """Derive and stream a plan's material until it ends or is given up."""
        index = first
        try:
            for offset, request in enumerate(plan):
                index = first + offset
                while (
                    max(self._channel(k).queued_bytes() for k in (0, 1)) > self.stream_buffer_bytes
                ):
                    if self._stop.is_set() or any(self._channel(k).failed for k in (0, 1)):
                        return
                    time.sleep(0.002)
                if self._stop.is_set():
                    return
                s0, s1, private = request_seeds(self._master, index, request, epoch)
                corrections = deal(request, s0, s1, private, self.mask_scale_bits)
                self._send_material([_MATERIAL, plan_id, index], s0, s1, corrections)
                index += 1
        except BaseException as exc:  # reported by _join_producer; the parties see END early
            self._producer_error = exc
        finally:
            end = np.array([_END, plan_id, index], dtype=np.uint64)
            for party_id in (0, 1):
                try:
                    self._send(party_id, end)
                except FedUnlearnError:
                    pass

    def _join_producer(self) -> None:
        if self._producer is None:
            return
        while self._producer.is_alive():
            self._producer.join(0.1)
        self._producer = None
        if self._producer_error is not None and not isinstance(
            self._producer_error, PeerDisconnectedError
        ):
            raise SecureComputationError(
                f"the dealer failed while streaming material: {self._producer_error}"
            ) from self._producer_error

    def _send(self, party_id: int, array: np.ndarray) -> None:
        try:
            self._channel(party_id).send(array)
        except PeerDisconnectedError as exc:
            message = f"the dealer lost party {party_id} ({exc}); the session is over"
            self._tell(1 - party_id, _GONE, message)
            raise PeerDisconnectedError(message) from exc
        self.sent_bytes[party_id] += array.nbytes

    def _tell(self, party_id: int, code: int, message: str) -> None:
        channel = self._channels[party_id]
        if channel is None:
            return
        try:  # best effort: the party may be gone already
            channel.send(np.array([code], dtype=np.int64))
            channel.send(np.frombuffer(message.encode()[:_MAX_ERROR_TEXT], dtype=np.uint8))
        except FedUnlearnError:
            pass


# ---- the parties' client ------------------------------------------------------------------


@dataclass
class _Plan:
    plan_id: int
    first: int
    requests: tuple[Request, ...]
    abandoned: bool = False
    ended: bool = False
    received: int = 0  # material items that arrived (I/O thread)

    @property
    def end(self) -> int:
        return self.first + len(self.requests)


@dataclass
class _Item:
    kind: str  # "reply", "material", "end"
    index: int
    plan_id: int = 0
    shares: tuple[np.ndarray, ...] = ()
    received: int = 0


class RemoteDealer(DealerClient):
    """A party's client of a ``DealerServer``: same methods as the simulated ``Dealer``.

    Requests are served on demand (one round trip each) unless declared ahead with ``plan``:
    then the dealer streams the material, an I/O thread receives and expands it ahead of use
    (at most ``prefetch_bytes`` of expanded shares wait), and each planned request is served
    locally. ``wait_prefetched`` blocks until a plan's material has arrived (the end of the
    offline phase). Pass the client to ``Party(party_id, transport, dealer=...)``; the party
    charges the material to its counters and ``Party.close()`` says goodbye to the dealer.

    Build one with ``RemoteDealer.connect``.

    Args:
        link: The joined link to the dealer (``link.connect_peer(..., wait_ready=False)``).
        party_id: 0 or 1.
        counters: Where offline bytes are charged (``Party`` points this at its own).
        mask_scale_bits: k of invertible masks; must equal the dealer's.
        prefetch_bytes: Expanded material that may wait for use.
        timeout_seconds: How long a reply or planned material may take.
    """

    def __init__(
        self,
        link: Link,
        party_id: int,
        counters: Counters | None = None,
        mask_scale_bits: int = 2,
        *,
        prefetch_bytes: int = DEFAULT_PREFETCH_BYTES,
        timeout_seconds: float = 60.0,
    ) -> None:
        super().__init__(party_id, counters, mask_scale_bits)
        self.link = link
        self.transport: TcpTransport = link.transport
        self.timeout_seconds = float(timeout_seconds)
        self._closed = False
        self._plans: dict[int, _Plan] = {}
        self._active: _Plan | None = None
        self._next_plan_id = 1
        self._outstanding: dict[int, Request] = {}
        # I/O-thread state: what the next frame is, and the item being assembled
        self._state = "ready"
        self._pending: tuple[str, int, int, Request | None] | None = None
        self._seed = b""
        self._error_code = 0
        self._channel = Channel(
            self.transport,
            expect=self._expect_next,
            on_frame=lambda frame: self._on_frame(frame),  # late-bound: tests may wrap it
            max_buffered_bytes=prefetch_bytes,
            write_timeout_seconds=self.timeout_seconds,
            name=f"dealer-client{party_id}",
        )

    @classmethod
    def connect(
        cls,
        host: str,
        port: int,
        party_id: int,
        *,
        counters: Counters | None = None,
        mask_scale_bits: int = 2,
        timeout_seconds: float = 60.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        identity: Identity | None = None,
        insecure: bool | None = None,
        binding: SessionBinding | None = None,
        prefetch_bytes: int = DEFAULT_PREFETCH_BYTES,
        handshake_timeout_seconds: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> RemoteDealer:
        """Connect to a dealer (retrying until ``timeout_seconds``), authenticate, say hello.

        Args:
            host: Dealer address.
            port: Dealer port.
            party_id: 0 or 1 (role ``server0``/``server1``).
            counters: Where offline bytes are charged (``Party`` points this at its own).
            mask_scale_bits: k of invertible masks; must equal the dealer's.
            timeout_seconds: Limit for connecting, for the other server to join, and for each
                reply (the dealer replies once the other party has made the same request).
            max_frame_bytes: Largest correction frame accepted from the dealer.
            identity: This server's TLS identity (role ``server0``/``server1``); the dealer
                must present a ``dealer`` certificate of the same CA. The secure setting.
            insecure: Plain TCP, chosen explicitly (``identity.INSECURE_WARNING``). With none
                of ``identity``, ``insecure`` and ``ssl_context``: plain TCP as older callers
                expect.
            binding: The session binding; the dealer sees only ``binding.for_dealer()``.
            prefetch_bytes: Expanded planned material that may wait for use.
            handshake_timeout_seconds: Bound on the TLS handshake and the hello answer.
            ssl_context: Legacy client-side TLS context (no role check).
            server_hostname: Name a legacy context verifies (default: host).

        Returns:
            The connected client (the dealer's "ready" is awaited with the first request).

        Raises:
            PeerAuthenticationError: TLS failed or the peer is not the dealer.
            SessionMismatchError: The dealer's session, job digest or mask_scale_bits differ.
            PeerDisconnectedError: No dealer listens at host:port.
        """
        legacy_plain = identity is None and ssl_context is None and insecure is None
        link = connect_peer(
            (host, port),
            role=party_role(party_id),
            peer_roles={"dealer"},
            binding=None if binding is None else binding.for_dealer(),
            options={"mask_scale_bits": int(mask_scale_bits)},
            identity=identity,
            insecure=bool(insecure) or legacy_plain,
            ssl_context=ssl_context,
            server_hostname=server_hostname,
            party_id=party_id,
            timeout_seconds=timeout_seconds,
            handshake_timeout_seconds=handshake_timeout_seconds,
            max_frame_bytes=max_frame_bytes,
            wait_ready=False,
        )
        return cls(
            link,
            party_id,
            counters,
            mask_scale_bits,
            prefetch_bytes=prefetch_bytes,
            timeout_seconds=timeout_seconds,
        )

    def __repr__(self) -> str:
        return f"RemoteDealer(party_id={self.party_id}, requests={self.requests})"

    # ---- I/O thread: frames into items ---------------------------------------------------

    def _expect_next(self) -> Expect:
        if self._state == "ready":
            return Expect(MAX_HELLO_BYTES, np.dtype(np.uint8))
        if self._state == "seed":
            return Expect(SEED_BYTES, np.dtype(np.uint8), (SEED_BYTES,))
        if self._state == "corrections":
            request = self._pending[3] if self._pending else None
            words = request.correction_words if request is not None else 0
            return Expect(8 * words, _U64, (words,))
        if self._state == "error":
            return Expect(_MAX_ERROR_TEXT, np.dtype(np.uint8))
        return Expect(_MAX_HEADER_BYTES)

    def _on_frame(self, frame: np.ndarray) -> tuple[_Item, int] | None:
        where = self.link.where
        if self._state == "ready":
            check_ready(decode_message(frame, where), where)
            self._state = "header"
            return None
        if self._state == "error":
            text = frame.tobytes().decode(errors="replace")
            raise _ERRORS.get(self._error_code, SecureComputationError)(
                f"the dealer stopped the session: {text}"
            )
        if self._state == "seed":
            self._seed = frame.tobytes()
            request = self._pending[3] if self._pending else None
            if self.party_id == 1 and request is not None and request.correction_shapes:
                self._state = "corrections"
                return None
            return self._finish([])
        if self._state == "corrections":
            request = self._pending[3] if self._pending else None
            return self._finish(request.split_corrections(frame) if request else [])
        # a header
        if frame.dtype == np.int64 and frame.shape == (1,):
            self._error_code, self._state = int(frame[0]), "error"
            return None
        words = [int(w) for w in frame.reshape(-1)] if frame.dtype == _U64 else []
        if len(words) == 2 and words[0] == _REPLY and words[1] in self._outstanding:
            self._pending = ("reply", words[1], 0, self._outstanding[words[1]])
            self._state = "seed"
            return None
        if len(words) == 3 and words[0] == _MATERIAL and words[1] in self._plans:
            plan = self._plans[words[1]]
            if plan.first <= words[2] < plan.end:
                request = plan.requests[words[2] - plan.first]
                self._pending = ("material", words[2], words[1], request)
                self._state = "seed"
                return None
        if len(words) == 3 and words[0] == _END and words[1] in self._plans:
            plan = self._plans[words[1]]
            plan.ended = True
            return _Item("end", words[2], words[1]), 0
        raise MalformedFrameError(
            f"the dealer sent an unexpected frame {frame.dtype} {frame.shape} "
            f"{words[:4] if words else ''}; is this address a fedunlearn dealer?"
        )

    def _finish(self, corrections: list[np.ndarray]) -> tuple[_Item, int] | None:
        kind, index, plan_id, request = self._pending  # type: ignore[misc]
        self._pending, self._state = None, "header"
        received = SEED_BYTES + sum(c.nbytes for c in corrections)
        if kind == "material":
            plan = self._plans[plan_id]
            plan.received += 1
            if plan.abandoned:  # given up: nothing will use it
                return None
        shares = expand(request, self.party_id, self._seed, corrections)  # type: ignore[arg-type]
        size = sum(s.nbytes for s in shares)
        return _Item(kind, index, plan_id, shares, received), size

    # ---- consumer side -------------------------------------------------------------------

    def _send(self, array: np.ndarray, what: str) -> None:
        if self._closed:
            raise PeerDisconnectedError("this dealer client is closed; cannot make requests")
        try:
            self._channel.send(array)
        except PeerDisconnectedError as exc:
            raise PeerDisconnectedError(f"lost the dealer during {what}: {exc}") from exc

    def _take(self, what: str) -> _Item:
        try:
            return self._channel.receive(self.timeout_seconds)
        except PeerDisconnectedError as exc:
            self.close()
            raise PeerDisconnectedError(f"lost the dealer during {what}: {exc}") from exc
        except FedUnlearnError:
            self.close()
            raise

    def plan(self, requests: Sequence[Request]) -> None:
        """Declare the next requests so the dealer streams their material ahead of use.

        Both parties must call this with the same list at the same point. A plan that is still
        running is given up first.

        Raises:
            ConfigError: More than ``MAX_PLAN_REQUESTS`` requests.
        """
        requests = tuple(requests)
        if len(requests) > MAX_PLAN_REQUESTS:
            raise ConfigError(
                f"a plan holds at most {MAX_PLAN_REQUESTS} requests; got {len(requests)}. "
                "Split it and declare the next part when this one is used up."
            )
        if not requests:
            return
        self._give_up(self.requests)
        plan = _Plan(self._next_plan_id, self.requests, requests)
        self._next_plan_id += 1
        self._plans[plan.plan_id] = plan  # before the dealer can answer
        self._send(_encode_plan(plan.plan_id, plan.first, requests), f"plan {plan.plan_id}")
        self._active = plan

    def wait_prefetched(self, timeout_seconds: float | None = None) -> bool:
        """Wait until the active plan's material has arrived (or the prefetch buffer is full).

        Returns:
            True if all of it arrived, False if the buffer filled first or there is no plan.

        Raises:
            PeerDisconnectedError: Nothing arrived for ``timeout_seconds`` (default: the
                client's timeout), or the dealer is gone.
        """
        plan = self._active
        if plan is None:
            return False
        limit = self.timeout_seconds if timeout_seconds is None else timeout_seconds
        last, progress_at = -1, time.monotonic()
        while plan.received < len(plan.requests) and not plan.ended:
            if self._channel.failed is not None:
                raise PeerDisconnectedError(
                    f"lost the dealer while prefetching: {self._channel.failed}"
                )
            if self._channel.buffered_bytes() >= self._channel.max_buffered_bytes:
                return False
            if plan.received != last:
                last, progress_at = plan.received, time.monotonic()
            elif time.monotonic() - progress_at > limit:
                raise PeerDisconnectedError(
                    f"the dealer streamed nothing for {limit:g} s ({plan.received} of "
                    f"{len(plan.requests)} planned requests arrived)"
                )
            time.sleep(0.002)
        return plan.received == len(plan.requests)

    def _give_up(self, index: int) -> None:
        """Leave the active plan at ``index`` (tell the dealer if part of it is still unused)."""
        plan, self._active = self._active, None
        if plan is None or plan.abandoned:
            return
        plan.abandoned = True  # its leftover material is dropped on arrival
        if index < plan.end:  # the dealer counts the plan as used: tell it where we left it
            self._send(np.array([_ABANDON, plan.plan_id, index], dtype=np.uint64), "abandon")

    def _obtain(self, index: int, request: Request) -> tuple[tuple[np.ndarray, ...], int]:
        what = f"request #{index} ({request})"
        plan = self._active
        if plan is not None:
            planned = (
                plan.first <= index < plan.end and plan.requests[index - plan.first] == request
            )
            if planned:  # its material, or the plan's end, is in the queue or on its way
                while True:
                    item = self._take(what)
                    if item.kind == "material" and item.plan_id == plan.plan_id:
                        if item.index != index:
                            raise MalformedFrameError(
                                f"the dealer streamed #{item.index} where #{index} was due"
                            )
                        return item.shares, item.received
                    if item.kind == "end" and item.plan_id == plan.plan_id:
                        break  # the dealer stopped the plan early: on demand from here
                    # anything else belongs to an earlier plan: drop it
            self._give_up(index)
        self._outstanding[index] = request
        self._send(_encode_request(index, request), what)
        while True:
            item = self._take(what)
            if item.kind == "reply" and item.index == index:
                del self._outstanding[index]
                return item.shares, item.received
            # streamed material or the end of a plan given up: drop it

    def _fetch(self, index: int, request: Request) -> tuple[bytes, list[np.ndarray]]:
        raise NotImplementedError("RemoteDealer serves material through _obtain")

    def close(self) -> None:
        """Say goodbye to the dealer and close the connection (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._channel.send(np.array([_BYE, self.requests], dtype=np.uint64))
        except FedUnlearnError:
            pass  # the link already failed; its error was (or will be) reported by a request
        # the goodbye is written first; then read until the dealer hangs up (in the background)
        # so that unread streamed material cannot reset the link before the goodbye is read
        self._channel.close(flush_seconds=2.0, background=True)
