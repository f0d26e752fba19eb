"""The dealer as its own process: a TCP ``DealerServer`` and the parties' ``RemoteDealer``.

The dealer of spec §2.1 is a trusted third party, so it runs apart from both servers and holds
the master secret alone (``secrets``, or a seed for tests). Each server connects once; the two
connections carry only this (TCP frames of ``fedunlearn.mpc.tcp``: same framing, size cap,
timeouts, optional TLS):

1. hello, party to dealer: ``[1, version, party_id, mask_scale_bits]`` (uint64).
2. request k, party to dealer: ``[2, k, kind, frac_bits, number of shapes, (ndim, dims...)...]``.
   The dealer waits for request k from *both* parties and checks they match (same k, kind and
   shapes); a mismatch ends the session with ``SecureComputationError`` at both parties, never
   with wrong randomness.
3. reply: party 0 receives its 16-byte seed (uint8) and nothing else; party 1 receives its seed
   and, for kinds with derived values, one uint64 frame of correction shares (``dealer.deal``).
   ZeroGen is the exception the functionality needs: both receive the same seed.
4. goodbye, party to dealer: ``[3, k]``. The dealer exits cleanly once both said goodbye.

An error reply is an int64 frame ``[code]`` followed by a uint8 message: 1 mismatch
(``SecureComputationError``), 2 malformed request (``MalformedFrameError``), 3 the other party
is gone (``PeerDisconnectedError``). A dealer that dies or stays silent past the timeout makes
``RemoteDealer`` raise ``PeerDisconnectedError``. Dealer material is charged to the party's
counters exactly as the simulated ``Dealer`` charges it (offline phase, 16 bytes per request
plus corrections for party 1); the small request frames are counted only on
``RemoteDealer.transport.counters``.

Whoever sees both connections learns all the correlated randomness (and so can unmask every
opened value), so off loopback use TLS
(``ssl_context``; ``certfile``/``keyfile`` for the launcher). The dealer is trusted and
semi-honest like the servers (spec §2.2); it sees no data, only request shapes.

Start the dealer with ``fedunlearn.mpc.dealer_process.start_dealer_process()`` (spawned child,
loopback, ephemeral port) or ``python -m fedunlearn.mpc.dealer_process --port 0``; then each
server connects with ``RemoteDealer.connect(host, port, party_id)`` and passes it as
``Party(..., dealer=...)``.

Paper: Starfish spec §2.1 (two non-colluding servers; the dealer a trusted third party), §2.2
(semi-honest), §3.2 (offline phase: the dealer sends only seeds and one correction share),
§12 item 2.
"""

from __future__ import annotations

import math
import socket
import ssl
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from fedunlearn.errors import MalformedFrameError, PeerDisconnectedError, SecureComputationError
from fedunlearn.mpc.dealer import KINDS, DealerClient, Request, deal, master_seed, request_seeds
from fedunlearn.mpc.prg import SEED_BYTES, fresh_seed
from fedunlearn.mpc.tcp import DEFAULT_MAX_FRAME_BYTES, TcpListener, TcpTransport
from fedunlearn.mpc.transport import Counters

__all__ = ["PROTOCOL_VERSION", "DealerServer", "RemoteDealer"]

PROTOCOL_VERSION = 1
_HELLO, _REQUEST, _BYE = 1, 2, 3
_MISMATCH, _MALFORMED, _GONE = 1, 2, 3
_ERRORS: dict[int, type[Exception]] = {
    _MISMATCH: SecureComputationError,
    _MALFORMED: MalformedFrameError,
    _GONE: PeerDisconnectedError,
}
T = TypeVar("T")
_MAX_REQUEST_BYTES = 1024  # a request frame is a few words; anything larger is rejected


def _encode_request(index: int, request: Request) -> np.ndarray:
    words = [_REQUEST, index, KINDS.index(request.kind), request.frac_bits, len(request.shapes)]
    for shape in request.shapes:
        words += [len(shape), *shape]
    return np.array(words, dtype=np.uint64)


def _decode(frame: np.ndarray, party_id: int) -> tuple[int, Request | None]:
    """Parse a request or goodbye frame into (sequence number, request or None for goodbye)."""
    words = [int(w) for w in frame.reshape(-1)] if frame.dtype == np.uint64 else []
    problem = f"a {frame.dtype} frame of shape {frame.shape} (expected uint64 words)"
    if len(words) == 2 and words[0] == _BYE:
        return words[1], None
    if len(words) >= 5 and words[0] == _REQUEST:
        index, kind, frac_bits, count = words[1:5]
        shapes, pos = [], 5
        while len(shapes) < min(count, 3) and pos < len(words):
            ndim = words[pos]
            shapes.append(tuple(words[pos + 1 : pos + 1 + ndim]))
            pos += 1 + ndim
        problem = f"an inconsistent request {words[:16]}"
        if kind < len(KINDS) and len(shapes) == count and pos == len(words) and frac_bits <= 40:
            try:
                return index, Request(KINDS[kind], tuple(shapes), frac_bits)
            except ValueError as exc:
                problem = f"an invalid request ({exc})"
    elif words:
        problem = f"frame tag {words[0]} (expected a request {_REQUEST} or goodbye {_BYE})"
    raise MalformedFrameError(f"party {party_id} sent the dealer {problem}")


class DealerServer:
    """The dealer process's server: accept both parties, then serve paired requests.

    Args:
        host: Address to bind (``127.0.0.1`` for loopback).
        port: Port, or 0 for an ephemeral one (read it back from ``.port``).
        seed: Master seed (int or bytes) for reproducible tests; None draws a fresh secret
            from the operating system (``secrets``), which never leaves this process.
        mask_scale_bits: k of invertible masks; both parties must announce the same.
        ssl_context: Server-side TLS context, or None for plain TCP.
        timeout_seconds: How long the second request of a pair, a hello or a send may take.
        idle_timeout_seconds: How long to wait for the parties to connect, and for the first
            request of a pair (the servers may compute locally for a long time in between).
        max_frame_bytes: Largest amount of material one request may ask for.
        listen_socket: An already listening socket to serve on instead of binding
            ``host:port`` (a launcher that binds ephemeral ports itself hands it over).

    Attributes:
        requests: Requests served so far.
        sent_bytes: Payload bytes sent to party 0 and party 1 (seeds, corrections, errors).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        seed: int | bytes | None = None,
        mask_scale_bits: int = 2,
        ssl_context: ssl.SSLContext | None = None,
        timeout_seconds: float = 60.0,
        idle_timeout_seconds: float = 3600.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        listen_socket: socket.socket | None = None,
    ) -> None:
        self._listener = TcpListener(host, port, ssl_context, sock=listen_socket)
        self.host, self.port = self._listener.host, self._listener.port
        self._master = fresh_seed() if seed is None else master_seed(seed)
        self.mask_scale_bits = int(mask_scale_bits)
        self.timeout_seconds = float(timeout_seconds)
        self.idle_timeout_seconds = float(idle_timeout_seconds)
        self.max_frame_bytes = int(max_frame_bytes)
        self.requests = 0
        self.sent_bytes = [0, 0]
        self._parties: list[TcpTransport | None] = [None, None]

    def __repr__(self) -> str:  # never prints the master secret
        return f"DealerServer(address={self.host}:{self.port}, requests={self.requests})"

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the parties connect to."""
        return self.host, self.port

    def serve(self) -> int:
        """Accept both parties and serve their requests until both say goodbye.

        Returns:
            The number of requests served.

        Raises:
            PeerDisconnectedError: A party disconnected or stayed silent past the timeout (the
                other party is told before the dealer stops).
            SecureComputationError: The parties' requests did not match (both are told).
            MalformedFrameError: A party sent something that is not a valid request.
        """
        try:
            self._accept()
            while True:
                got = [self._read(0), self._read(1)]
                if got[0][1] is None and got[1][1] is None:
                    return self.requests
                self._check_pair(got)
                self._serve(got[0][1])  # type: ignore[arg-type]
        finally:
            self.close()

    def close(self) -> None:
        """Close both party connections and stop listening."""
        for transport in self._parties:
            if transport is not None:
                transport.close()
        self._listener.close()

    def _accept(self) -> None:
        for _ in range(2):
            transport = self._listener.accept(
                timeout_seconds=self.idle_timeout_seconds, max_frame_bytes=_MAX_REQUEST_BYTES
            )
            transport.set_timeout(self.timeout_seconds)
            hello = transport.recv()
            words = [int(w) for w in hello] if hello.dtype == np.uint64 else []
            if len(words) != 4 or words[0] != _HELLO or words[1] != PROTOCOL_VERSION:
                expected = f"[{_HELLO}, {PROTOCOL_VERSION}, party_id, mask_scale_bits]"
                problem = f"a bad hello {words or hello.dtype} (expected {expected})"
            elif words[2] not in (0, 1) or self._parties[words[2]] is not None:
                problem = f"party id {words[2]} (taken or not 0/1)"
            elif words[3] != self.mask_scale_bits:
                problem = f"mask_scale_bits={words[3]}, but this dealer uses {self.mask_scale_bits}"
            else:
                self._parties[words[2]] = transport
                continue
            message = f"dealer {self.host}:{self.port} rejected a connection: {problem}"
            self._send_error(transport, _MALFORMED, message)
            transport.close()
            raise MalformedFrameError(message)
        self._listener.close()  # exactly two parties: nobody else may connect

    def _read(self, party_id: int) -> tuple[int, Request | None]:
        """Read party ``party_id``'s next request; tell the other party if this fails."""
        transport = self._party(party_id)
        first = party_id == 0  # the first request of a pair may follow a long idle time
        transport.set_timeout(self.idle_timeout_seconds if first else self.timeout_seconds)
        try:
            return _decode(transport.recv(), party_id)
        except PeerDisconnectedError as exc:
            message = f"the dealer lost party {party_id} ({exc}); the session is over"
            self._tell(1 - party_id, _GONE, message)
            raise PeerDisconnectedError(message) from exc
        except MalformedFrameError as exc:
            self._tell(party_id, _MALFORMED, str(exc))
            self._tell(1 - party_id, _GONE, f"the dealer ended the session: {exc}")
            raise

    def _party(self, party_id: int) -> TcpTransport:
        transport = self._parties[party_id]
        if transport is None:
            raise PeerDisconnectedError(f"party {party_id} is not connected to the dealer")
        return transport

    def _check_pair(self, got: list[tuple[int, Request | None]]) -> None:
        (k0, r0), (k1, r1) = got
        if k0 == k1 == self.requests and r0 == r1:
            return
        asked = [
            f"ended its session after {k} requests" if r is None else f"asked for #{k}: {r}"
            for k, r in got
        ]
        message = (
            f"dealer requests do not match at request #{self.requests}: party 0 {asked[0]}, "
            f"party 1 {asked[1]}. Both parties must make the same dealer requests in the same "
            "order (run the same program on inputs of the same shapes)."
        )
        for party_id, (_, request) in enumerate(got):
            if request is not None:  # a party that said goodbye has closed its end
                self._tell(party_id, _MISMATCH, message)
        raise SecureComputationError(message)

    def _serve(self, request: Request) -> None:
        shapes = request.random_shapes + request.correction_shapes
        material_bytes = 8 * sum(math.prod(s) for s in shapes)
        if material_bytes > self.max_frame_bytes:
            message = (
                f"request #{self.requests} ({request}) needs {material_bytes} bytes of material; "
                f"this dealer allows at most {self.max_frame_bytes} (max_frame_bytes) per request"
            )
            for party_id in (0, 1):
                self._tell(party_id, _MALFORMED, message)
            raise MalformedFrameError(message)
        s0, s1, private = request_seeds(self._master, self.requests, request)
        self._send(0, np.frombuffer(s0, dtype=np.uint8))  # party 0: the seed, nothing else
        corrections = deal(request, s0, s1, private, self.mask_scale_bits)
        self._send(1, np.frombuffer(s1, dtype=np.uint8))
        if request.correction_shapes:
            self._send(1, np.concatenate([c.reshape(-1) for c in corrections]))
        self.requests += 1

    def _send(self, party_id: int, array: np.ndarray) -> None:
        transport = self._party(party_id)
        try:
            transport.send(array)
        except PeerDisconnectedError as exc:
            message = f"the dealer lost party {party_id} ({exc}); the session is over"
            self._tell(1 - party_id, _GONE, message)
            raise PeerDisconnectedError(message) from exc
        self.sent_bytes[party_id] += array.nbytes

    def _tell(self, party_id: int, code: int, message: str) -> None:
        transport = self._parties[party_id]
        if transport is not None:
            self._send_error(transport, code, message)

    @staticmethod
    def _send_error(transport: TcpTransport, code: int, message: str) -> None:
        try:  # best effort: the party may be gone already
            transport.send(np.array([code], dtype=np.int64))
            transport.send(np.frombuffer(message.encode(), dtype=np.uint8))
        except PeerDisconnectedError:
            pass


class RemoteDealer(DealerClient):
    """A party's client of a ``DealerServer``: same methods as the simulated ``Dealer``.

    Each request is one round trip to the dealer (which pairs it with the other party's). Pass
    the client to ``Party(party_id, transport, dealer=...)``; the party charges the material to
    its counters and ``Party.close()`` says goodbye to the dealer.

    Args:
        transport: A connected ``TcpTransport`` to the dealer.
        party_id: 0 or 1.
        counters: Where offline bytes are charged (``Party`` points this at its own).
        mask_scale_bits: k of invertible masks; must equal the dealer's.
    """

    def __init__(
        self,
        transport: TcpTransport,
        party_id: int,
        counters: Counters | None = None,
        mask_scale_bits: int = 2,
    ) -> None:
        super().__init__(party_id, counters, mask_scale_bits)
        self.transport = transport
        self._closed = False
        hello = [_HELLO, PROTOCOL_VERSION, party_id, self.mask_scale_bits]
        self.transport.send(np.array(hello, dtype=np.uint64))

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
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> RemoteDealer:
        """Connect to a dealer, retrying until ``timeout_seconds`` have passed, and say hello.

        Args:
            host: Dealer address.
            port: Dealer port.
            party_id: 0 or 1.
            counters: Where offline bytes are charged (``Party`` points this at its own).
            mask_scale_bits: k of invertible masks; must equal the dealer's.
            timeout_seconds: Limit for connecting and for each reply (the dealer replies once
                the other party has made the same request).
            max_frame_bytes: Largest correction frame accepted from the dealer.
            ssl_context: Client-side TLS context, or None for plain TCP.
            server_hostname: Name to verify the dealer's certificate against (default: host).

        Returns:
            The connected client.
        """
        transport = TcpTransport.connect(
            host,
            port,
            party_id=party_id,
            timeout_seconds=timeout_seconds,
            max_frame_bytes=max_frame_bytes,
            ssl_context=ssl_context,
            server_hostname=server_hostname,
        )
        return cls(transport, party_id, counters, mask_scale_bits)

    def __repr__(self) -> str:
        return f"RemoteDealer(party_id={self.party_id}, requests={self.requests})"

    def _fetch(self, index: int, request: Request) -> tuple[bytes, list[np.ndarray]]:
        if self._closed:
            raise PeerDisconnectedError("this dealer client is closed; cannot make requests")
        what = f"request #{index} ({request})"
        self._io(what, lambda: self.transport.send(_encode_request(index, request)))
        seed = self._reply(what, np.dtype(np.uint8), SEED_BYTES).tobytes()
        if self.party_id == 0 or not request.correction_shapes:
            return seed, []
        words = self._reply(what, np.dtype(np.uint64), request.correction_words)
        return seed, request.split_corrections(words)

    def _io(self, what: str, step: Callable[[], T]) -> T:
        """Run one transport step; a lost dealer closes this client and says which request."""
        try:
            return step()
        except PeerDisconnectedError as exc:
            self.close()
            raise PeerDisconnectedError(f"lost the dealer during {what}: {exc}") from exc
        except MalformedFrameError as exc:
            self.close()
            raise MalformedFrameError(f"bad frame from the dealer during {what}: {exc}") from exc

    def _reply(self, what: str, dtype: np.dtype, size: int) -> np.ndarray:
        frame = self._io(what, self.transport.recv)
        if frame.dtype == np.int64 and frame.shape == (1,):
            code = int(frame[0])
            text = self._io(what, self.transport.recv).tobytes().decode(errors="replace")
            self.close()
            raise _ERRORS.get(code, SecureComputationError)(f"the dealer refused {what}: {text}")
        if frame.dtype != dtype or frame.shape != (size,):
            self.close()
            raise MalformedFrameError(
                f"the dealer answered {what} with a {frame.dtype} frame of shape {frame.shape}; "
                f"expected {dtype} of shape ({size},). Is this address a fedunlearn dealer?"
            )
        return frame

    def close(self) -> None:
        """Say goodbye to the dealer and close the connection (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.transport.send(np.array([_BYE, self.requests], dtype=np.uint64))
        except PeerDisconnectedError:
            pass
        self.transport.close()
