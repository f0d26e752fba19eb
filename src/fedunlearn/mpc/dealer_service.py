"""The dealer as its own process: the ``DealerServer``.

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

The messages (requests, plans, abandons, goodbyes; replies, streamed material, errors) are
in ``dealer_wire``; the parties' client is ``remote_dealer.RemoteDealer``.

The material it serves is ``dealer.py``'s (the paper's offline functionalities). What the
dealer learns: docs/security.md; the offline phase measured: docs/performance.md.
"""

from __future__ import annotations

import socket
import threading
import time
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
from fedunlearn.mpc.dealer import Request, deal, master_seed, request_seeds
from fedunlearn.mpc.dealer_wire import (
    END,
    GONE,
    MALFORMED,
    MATERIAL,
    MAX_ERROR_TEXT,
    MAX_MESSAGE_BYTES,
    MISMATCH,
    PROTOCOL_VERSION,
    REPLY,
    U64,
    Message,
    decode_or_error,
    material_bytes,
)
from fedunlearn.mpc.identity import party_role
from fedunlearn.mpc.link import accept_peers
from fedunlearn.mpc.prg import fresh_seed
from fedunlearn.mpc.remote_dealer import RemoteDealer
from fedunlearn.mpc.security import LinkLimits, Security
from fedunlearn.mpc.session import SessionBinding
from fedunlearn.mpc.tcp import DEFAULT_MAX_FRAME_BYTES, Expect, TcpListener

__all__ = ["PROTOCOL_VERSION", "DealerOptions", "DealerServer", "RemoteDealer"]


@dataclass(frozen=True)
class DealerOptions:
    """The dealer's protocol option and bounds (the same for every session it serves).

    Args:
        mask_scale_bits: k of invertible masks; both parties must announce the same.
        timeout_seconds: How long the second message of a pair, or a send, may take.
        idle_timeout_seconds: How long to wait for the first message of a pair (the servers
            may compute locally for a long time in between).
        accept_timeout_seconds: How long to wait for both servers to join (None: idle).
        handshake_timeout_seconds: Bound on one connection's TLS handshake and hello.
        max_frame_bytes: Largest amount of material one request may ask for.
        stream_buffer_bytes: Material queued per party before the producer waits for it to
            be read.
    """

    mask_scale_bits: int = 2
    timeout_seconds: float = 60.0
    idle_timeout_seconds: float = 3600.0
    accept_timeout_seconds: float | None = None
    handshake_timeout_seconds: float = 10.0
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    stream_buffer_bytes: int = 256 << 20

    def join_limits(self) -> LinkLimits:
        """The bounds of the servers' links while they join (messages: ``MAX_MESSAGE_BYTES``)."""
        accept = self.accept_timeout_seconds
        return LinkLimits(
            timeout_seconds=self.timeout_seconds,
            accept_timeout_seconds=self.idle_timeout_seconds if accept is None else accept,
            handshake_timeout_seconds=self.handshake_timeout_seconds,
            max_frame_bytes=MAX_MESSAGE_BYTES,
        )


class DealerServer:
    """The dealer process's server: accept both servers, then serve paired requests and plans.

    Args:
        security: The dealer's TLS identity (role ``dealer``): mutual TLS, the servers' roles
            from their certificates (the secure setting); or ``Security.plain()``, plain TCP
            chosen explicitly (``identity.INSECURE_WARNING``). There is no default.
        host: Address to bind (``127.0.0.1`` for loopback).
        port: Port, or 0 for an ephemeral one (read it back from ``.port``).
        listen_socket: An already listening socket to serve on instead of binding
            ``host:port`` (a launcher that binds ephemeral ports itself hands it over).
        seed: Master seed (int or bytes) for reproducible tests; None draws a fresh secret
            from the operating system (``secrets``), which never leaves this process.
        binding: The session's binding as the dealer sees it (``SessionBinding.for_dealer``);
            None: the servers' bindings must only agree with each other.
        options: Protocol option and bounds (default: ``DealerOptions()``).

    Attributes:
        requests: Requests served so far (on demand or streamed).
        sent_bytes: Payload bytes sent to party 0 and party 1 (seeds, corrections, headers).
        security: How the links are secured (one line). Refused connections are logged
            (logger ``fedunlearn.mpc.link``).
    """

    def __init__(
        self,
        security: Security,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        listen_socket: socket.socket | None = None,
        seed: int | bytes | None = None,
        binding: SessionBinding | None = None,
        options: DealerOptions | None = None,
    ) -> None:
        if not isinstance(security, Security):
            raise ConfigError(
                "the dealer needs a Security: its TLS identity, or Security.plain() for plain "
                f"TCP chosen explicitly; got {type(security).__name__}"
            )
        security.require_role("dealer")
        options = options or DealerOptions()
        self._security = security
        self._listener = TcpListener(host, port, sock=listen_socket)
        self.host, self.port = self._listener.host, self._listener.port
        self._master = fresh_seed() if seed is None else master_seed(seed)
        self.options = options
        self.mask_scale_bits = int(options.mask_scale_bits)
        self.binding = None if binding is None else binding.for_dealer()
        self.timeout_seconds = float(options.timeout_seconds)
        self.idle_timeout_seconds = float(options.idle_timeout_seconds)
        self.max_frame_bytes = int(options.max_frame_bytes)
        self.stream_buffer_bytes = int(options.stream_buffer_bytes)
        self.requests = 0
        self.sent_bytes = [0, 0]
        self.security = security.describe()
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
        links = accept_peers(
            self._listener,
            role="dealer",
            peer_roles={"server0", "server1"},
            security=self._security,
            binding=self.binding,
            adopt_binding=self.binding is None,
            options={"mask_scale_bits": self.mask_scale_bits},
            limits=self.options.join_limits(),
        )
        self._listener.close()  # each role is served once: nobody else may join
        for party_id in (0, 1):
            link = links[party_role(party_id)]
            self._channels[party_id] = Channel(
                link.transport,
                expect=lambda: Expect(MAX_MESSAGE_BYTES, U64),
                # k binds this party's id (mypy infers no lambda with a default argument)
                on_frame=lambda array, k=party_id: (decode_or_error(array, k), array.nbytes),  # type: ignore[misc]
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

    def _read(self, party_id: int, timeout_seconds: float) -> Message:
        """Read party ``party_id``'s next message; tell the other party if this fails."""
        try:
            item = self._channel(party_id).receive(timeout_seconds)
            if isinstance(item, MalformedFrameError):
                raise item
            return item
        except MalformedFrameError as exc:
            self._tell(party_id, MALFORMED, str(exc))
            self._tell(1 - party_id, GONE, f"the dealer ended the session: {exc}")
            raise
        except FedUnlearnError as exc:
            message = f"the dealer lost party {party_id} ({exc}); the session is over"
            self._tell(1 - party_id, GONE, message)
            raise PeerDisconnectedError(message) from exc

    def _check_pair(self, first: Message, second: Message) -> None:
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
                self._tell(party_id, MISMATCH, message)
        raise SecureComputationError(message)

    # ---- serving -----------------------------------------------------------------------------

    def _check_size(self, request: Request, index: int) -> None:
        needed = material_bytes(request)
        if needed > self.max_frame_bytes:
            message = (
                f"request #{index} ({request}) needs {needed} bytes of material; this dealer "
                f"allows at most {self.max_frame_bytes} (max_frame_bytes) per request"
            )
            for party_id in (0, 1):
                self._tell(party_id, MALFORMED, message)
            raise MalformedFrameError(message)

    def _material(self, index: int, request: Request) -> tuple[bytes, bytes, list[np.ndarray]]:
        s0, s1, private = request_seeds(self._master, index, request, self._epoch)
        corrections = deal(request, s0, s1, private, self.mask_scale_bits)
        return s0, s1, corrections

    def _send_material(
        self,
        header: list[int],
        s0: bytes,
        s1: bytes,
        corrections: list[np.ndarray],
        *,
        tell: bool = True,
    ) -> None:
        head = np.array(header, dtype=np.uint64)
        self._send(0, head, tell=tell)
        self._send(0, np.frombuffer(s0, dtype=np.uint8), tell=tell)  # party 0: the seed only
        self._send(1, head, tell=tell)
        self._send(1, np.frombuffer(s1, dtype=np.uint8), tell=tell)
        if corrections:
            self._send(1, np.concatenate([c.reshape(-1) for c in corrections]), tell=tell)

    def _serve(self, request: Request) -> None:
        self._check_size(request, self.requests)
        s0, s1, corrections = self._material(self.requests, request)
        self._send_material([REPLY, self.requests], s0, s1, corrections)
        self.requests += 1

    def _start_plan(self, message: Message) -> None:
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
                # a party that said goodbye may hang up while the plan still streams: only the
                # serving loop, which reads its goodbye or its loss, tells the other party
                self._send_material([MATERIAL, plan_id, index], s0, s1, corrections, tell=False)
                index += 1
        except BaseException as exc:  # reported by _join_producer; the parties see END early
            self._producer_error = exc
        finally:
            end = np.array([END, plan_id, index], dtype=np.uint64)
            for party_id in (0, 1):
                try:
                    self._send(party_id, end, tell=False)
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

    def _send(self, party_id: int, array: np.ndarray, *, tell: bool = True) -> None:
        """Queue ``array`` for a party; if it is gone, tell the other one (``tell``) and raise.

        The producer streams with ``tell=False``: a send failing there may be a party that said
        goodbye and hung up with the plan unused, which is no loss; the serving loop reads that
        party's next message and decides (``_read`` tells the other party of a real loss).
        """
        try:
            self._channel(party_id).send(array)
        except PeerDisconnectedError as exc:
            message = f"the dealer lost party {party_id} ({exc}); the session is over"
            if tell:
                self._tell(1 - party_id, GONE, message)
            raise PeerDisconnectedError(message) from exc
        self.sent_bytes[party_id] += array.nbytes

    def _tell(self, party_id: int, code: int, message: str) -> None:
        channel = self._channels[party_id]
        if channel is None:
            return
        try:  # best effort: the party may be gone already
            channel.send(np.array([code], dtype=np.int64))
            channel.send(np.frombuffer(message.encode()[:MAX_ERROR_TEXT], dtype=np.uint8))
        except FedUnlearnError:
            pass
