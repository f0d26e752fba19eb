"""TCP transport between two processes: bounded frames, deadlines, full duplex, optional TLS.

Frame: a 16-byte header ``!4sBBxxQ`` (magic ``FUMP``, dtype code, ndim, payload length), then
ndim uint64 dimensions, then the raw little-endian payload. The receiver checks, *before* it
allocates or reads the payload:

- the magic, the dtype code (uint64, uint8, int64, float64) and ``ndim <= 8``;
- the payload length against the cap of this receive: ``max_frame_bytes`` of the transport, or
  a smaller ``max_bytes`` the caller knows from the protocol (a dealer reply is 16 bytes plus
  the corrections of the request; an ``exchange`` expects exactly the dtype and shape it sends,
  since both parties open arrays of one shape);
- every dimension (at most the cap in elements) and that the shape's size matches the length;

and raises ``MalformedFrameError`` (connection closed) otherwise. The payload is read
incrementally into buffers that grow with the bytes that actually arrived (at most twice what
was received plus 1 MiB), so a 1 KiB header declaring a huge frame allocates nothing.

Deadlines: the first byte of a frame may take ``timeout_seconds`` (the peer is idle or
computing); from then on the whole frame must arrive within ``timeout_seconds + length /
min_bytes_per_second``, so a peer that drips a byte now and then is dropped with
``PeerDisconnectedError`` instead of holding the connection forever. Sends have the same bound.

One thread drives the socket in non-blocking mode: ``exchange`` writes its frame while reading
the peer's (full duplex, also over TLS, without a second thread touching the SSL object), so
two large simultaneous sends never deadlock on full socket buffers.

What the framing guards against: docs/security.md.
"""

from __future__ import annotations

import math
import select
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass

import numpy as np

from fedunlearn.errors import MalformedFrameError, PeerDisconnectedError
from fedunlearn.mpc.transport import Transport

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "DEFAULT_MIN_BYTES_PER_SECOND",
    "FrameReader",
    "FrameWriter",
    "TcpListener",
    "TcpTransport",
    "encode_header",
]

DEFAULT_MAX_FRAME_BYTES = 1 << 30
DEFAULT_MIN_BYTES_PER_SECOND = 1e6  # a frame slower than this (after its first byte) is dropped
_HEADER = struct.Struct("!4sBBxxQ")
_MAGIC = b"FUMP"
_MAX_NDIM = 8
_FIRST_CHUNK = 1 << 20  # payload buffers start here and grow with what arrived
_SEND_CHUNK = 1 << 18  # bytes handed to one send call (retried unchanged after WantWrite)
_READS_PER_STEP = 64
_DTYPES: dict[int, np.dtype] = {
    1: np.dtype("<u8"),
    2: np.dtype("u1"),
    3: np.dtype("<i8"),
    4: np.dtype("<f8"),
}
_CODES = {dtype.str: code for code, dtype in _DTYPES.items()}
_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantWriteError, ssl.SSLWantReadError)


def encode_header(array: np.ndarray) -> bytes:
    """Return the header and shape bytes that precede ``array``'s payload on the wire."""
    code = _CODES.get(array.dtype.str)
    if code is None:
        raise TypeError(f"cannot send dtype {array.dtype}; allowed: uint64, uint8, int64, float64")
    if array.ndim > _MAX_NDIM:
        raise ValueError(f"cannot send a {array.ndim}-d array; at most {_MAX_NDIM} dimensions")
    shape = struct.pack(f"!{array.ndim}Q", *array.shape)
    return _HEADER.pack(_MAGIC, code, array.ndim, array.nbytes) + shape


def _wire_array(array: np.ndarray) -> np.ndarray:
    payload = np.ascontiguousarray(array).reshape(np.shape(array))  # keeps 0-d arrays 0-d
    if payload.dtype.byteorder == ">":
        payload = payload.astype(payload.dtype.newbyteorder("<"))
    return payload


@dataclass(frozen=True)
class Expect:
    """What a receive accepts: a byte cap and, where the protocol knows them, dtype and shape."""

    max_bytes: int
    dtype: np.dtype | None = None
    shape: tuple[int, ...] | None = None


class FrameWriter:
    """One outgoing frame, written in chunks by whoever drives the socket."""

    def __init__(self, array: np.ndarray) -> None:
        payload = _wire_array(array)
        head = encode_header(payload)
        self._parts = [memoryview(head)]
        if payload.nbytes:
            self._parts.append(memoryview(payload.reshape(-1)).cast("B"))  # type: ignore[arg-type]  # numpy declares __buffer__ for Python 3.12+ only
        self.total = len(head) + payload.nbytes
        self.payload_bytes = payload.nbytes
        self.sent = 0
        self._part, self._offset = 0, 0

    @classmethod
    def raw(cls, data: bytes) -> FrameWriter:
        """Unframed bytes (tests of frame validation)."""
        writer = cls.__new__(cls)
        writer._parts, writer.total, writer.sent = [memoryview(data)], len(data), 0
        writer.payload_bytes = len(data)
        writer._part, writer._offset = 0, 0
        return writer

    @property
    def done(self) -> bool:
        """True once every byte was handed to the socket."""
        return self.sent >= self.total

    def chunk(self) -> memoryview:
        """The next bytes to send; the same slice until ``advance`` is called (TLS retries)."""
        part = self._parts[self._part]
        return part[self._offset : self._offset + _SEND_CHUNK]

    def advance(self, count: int) -> None:
        """Record that ``count`` bytes of ``chunk()`` were sent."""
        self.sent += count
        self._offset += count
        if self._offset >= len(self._parts[self._part]) and self._part + 1 < len(self._parts):
            self._part, self._offset = self._part + 1, 0


class FrameReader:
    """One incoming frame, validated stage by stage (header, shape, payload) as bytes arrive.

    Args:
        expect: Cap, and optionally the exact dtype and shape, of the frame.
        peer: How error messages name the sender.
    """

    def __init__(self, expect: Expect, peer: str = "the peer") -> None:
        self.expect, self.peer = expect, peer
        self.stage = "header"
        self._buf: bytearray | np.ndarray = bytearray(_HEADER.size)
        self._got = 0
        self.received = 0
        self.declared = 0  # payload bytes the header announced
        self.first_byte_at: float | None = None
        self._dtype: np.dtype | None = None
        self._shape: tuple[int, ...] = ()
        self._chunks: list[np.ndarray] = []
        self.array: np.ndarray | None = None

    @property
    def done(self) -> bool:
        """True once the frame is complete (``array`` holds it)."""
        return self.stage == "done"

    def result(self) -> np.ndarray:
        """The received array (only once ``done``)."""
        if self.array is None:
            raise RuntimeError("the frame is not complete yet")
        return self.array

    def view(self) -> memoryview:
        """Where the next bytes go (never larger than what the current stage still needs)."""
        return memoryview(self._buf)[self._got :]  # type: ignore[arg-type]

    def advance(self, count: int, now: float) -> None:
        """Record ``count`` bytes written into ``view()``; move on when a stage is complete."""
        if self.first_byte_at is None:
            self.first_byte_at = now
        self._got += count
        self.received += count
        while self._got == len(self._buf) and self.stage != "done":
            self._next_stage()

    def _reject(self, problem: str) -> None:
        raise MalformedFrameError(
            f"rejected a frame from {self.peer}: {problem}; connection closed"
        )

    def _next_stage(self) -> None:
        if self.stage == "header":
            magic, code, ndim, nbytes = _HEADER.unpack(self._buf)  # type: ignore[arg-type]  # a bytearray here
            if magic != _MAGIC:
                self._reject(f"bad magic {bytes(magic)!r} (expected {_MAGIC!r})")
            if code not in _DTYPES:
                self._reject(f"unknown dtype code {code} (allowed {sorted(_DTYPES)})")
            if ndim > _MAX_NDIM:
                self._reject(f"{ndim} dimensions (at most {_MAX_NDIM})")
            if nbytes > self.expect.max_bytes:
                self._reject(
                    f"payload of {nbytes} bytes exceeds the cap of {self.expect.max_bytes} bytes "
                    "for this message (max_frame_bytes or the protocol's known size)"
                )
            self._dtype, self.declared = _DTYPES[code], nbytes
            if self.expect.dtype is not None and self._dtype != self.expect.dtype:
                self._reject(f"dtype {self._dtype} where this step expects {self.expect.dtype}")
            self.stage, self._buf, self._got = "shape", bytearray(8 * ndim), 0
        elif self.stage == "shape":
            ndim = len(self._buf) // 8
            shape = struct.unpack(f"!{ndim}Q", self._buf)  # type: ignore[arg-type]  # a bytearray here
            itemsize = self._dtype.itemsize if self._dtype is not None else 1
            if self.expect.shape is not None:  # the protocol fixed it: nothing else will do
                if tuple(shape) != self.expect.shape:
                    self._reject(f"shape {shape} where this step expects {self.expect.shape}")
            else:
                max_elements = max(self.expect.max_bytes // itemsize, 1)
                if any(d > max_elements for d in shape):
                    self._reject(f"shape {shape} has a dimension above {max_elements}")
            needed = math.prod(shape) * itemsize
            if needed != self.declared:
                self._reject(
                    f"shape {shape} needs {needed} bytes but the frame declares {self.declared}"
                )
            self._shape, self.stage = tuple(shape), "payload"
            self._new_chunk()
        else:  # payload chunk full
            self._chunks.append(self._buf)  # type: ignore[arg-type]  # an array in this stage
            if sum(len(c) for c in self._chunks) < self.declared:
                self._new_chunk()
            else:
                self._finish()

    def _new_chunk(self) -> None:
        so_far = sum(len(c) for c in self._chunks)
        left = self.declared - so_far
        if left == 0:
            self._finish()
            return
        # exact size when the protocol fixed it (our own array's size); else grow with arrivals
        size = left if self.expect.shape is not None else min(left, max(_FIRST_CHUNK, so_far))
        self._buf, self._got = np.empty(size, dtype=np.uint8), 0  # no zeroing pass

    def _finish(self) -> None:
        if not self._chunks:
            data = np.empty(0, dtype=np.uint8)
        elif len(self._chunks) == 1:
            data = self._chunks[0]
        else:
            data = np.concatenate(self._chunks)
        self._chunks = []
        self.array = data.view(self._dtype).reshape(self._shape)  # type: ignore[arg-type]  # set by the header
        self.stage = "done"


def _closed_message(peer: str, what: str, reader: FrameReader) -> str:
    """The error for a peer that closed the connection: between frames, or inside one."""
    if reader.received == 0:
        return f"{peer} closed the connection while {what} (between frames: its stream ended)"
    return (
        f"{peer} closed the connection inside a frame while {what}: it sent {reader.received} "
        "bytes of the frame and hung up (a truncated frame)"
    )


class TcpTransport(Transport):
    """One end of a TCP connection to the other party (plain, or an ``ssl.SSLSocket``).

    Build one with ``TcpListener(...).accept()`` or ``TcpTransport.connect``, or, with roles
    checked and the session bound, ``fedunlearn.mpc.link.accept_peer``/``connect_peer``.

    Args:
        sock: A connected socket (already wrapped and handshaken if TLS is used).
        party_id: 0 or 1 (kept for callers; the exchange is full duplex either way).
        timeout_seconds: How long the first byte of a frame may take.
        max_frame_bytes: Largest payload accepted from the peer.
        min_bytes_per_second: Slowest acceptable rate once a frame has started.
        peer_name: How messages name the peer (e.g. ``server1 at 10.0.0.2:4711``).

    Attributes:
        wire_bytes_sent: Frame bytes written (headers included), over the connection's life.
        wire_bytes_received: Frame bytes read (headers included).
    """

    def __init__(
        self,
        sock: socket.socket,
        party_id: int,
        timeout_seconds: float = 60.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        *,
        min_bytes_per_second: float = DEFAULT_MIN_BYTES_PER_SECOND,
        peer_name: str = "the peer",
    ) -> None:
        super().__init__(timeout_seconds)
        self._sock = sock
        self._sock.setblocking(False)
        self.party_id = party_id
        self.max_frame_bytes = int(max_frame_bytes)
        self.min_bytes_per_second = float(min_bytes_per_second)
        self.peer_name = peer_name
        self.wire_bytes_sent = 0
        self.wire_bytes_received = 0
        self._closed = False
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # rounds are latency-bound

    @classmethod
    def connect(
        cls,
        host: str,
        port: int,
        *,
        party_id: int = 1,
        timeout_seconds: float = 60.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> TcpTransport:
        """Connect to a listening party, retrying until ``timeout_seconds`` have passed.

        This neither authenticates the peer's role nor binds the session: deployments use
        ``fedunlearn.mpc.link.connect_peer``.
        """
        sock = connect_socket(host, port, timeout_seconds)
        if ssl_context is not None:
            sock.settimeout(timeout_seconds)
            try:
                sock = ssl_context.wrap_socket(sock, server_hostname=server_hostname or host)
            except (ssl.SSLError, OSError) as exc:
                sock.close()
                raise PeerDisconnectedError(
                    f"TLS handshake with {host}:{port} failed: {exc}"
                ) from exc
        return cls(sock, party_id, timeout_seconds, max_frame_bytes, peer_name=f"{host}:{port}")

    # ---- the one loop that moves bytes -------------------------------------------------------

    def _pump(self, writer: FrameWriter | None, reader: FrameReader | None, what: str) -> None:
        """Drive ``writer`` and ``reader`` to completion on the non-blocking socket."""
        if self._closed:
            raise PeerDisconnectedError(f"the connection to {self.peer_name} is closed")
        start = time.monotonic()
        send_deadline = None
        if writer is not None:
            send_deadline = start + self.timeout_seconds + writer.total / self.min_bytes_per_second
        while (writer is not None and not writer.done) or (reader is not None and not reader.done):
            progress, want_read, want_write = self.step(writer, reader, what)
            if progress:
                continue
            now = time.monotonic()
            deadline, late = self._deadline(start, send_deadline, writer, reader)
            if now >= deadline:
                self._fail()
                raise PeerDisconnectedError(f"{late} while {what}")
            self.wait(want_read, want_write, deadline - now)

    def step(
        self, writer: FrameWriter | None, reader: FrameReader | None, what: str
    ) -> tuple[bool, bool, bool]:
        """Try once to send and once to receive without blocking.

        Returns:
            (progress made, wants the socket readable, wants it writable).

        Raises:
            PeerDisconnectedError: The connection failed or the peer closed it.
            MalformedFrameError: The incoming frame broke a rule (connection closed).
        """
        progress, want_read, want_write = self.send_step(writer, what)
        got, read_more, write_first = self.recv_step(reader, what)
        return progress or got, want_read or read_more, want_write or write_first

    def send_step(
        self, writer: FrameWriter | None, what: str, *, close_on_error: bool = True
    ) -> tuple[bool, bool, bool]:
        """Hand the next chunk of ``writer`` to the socket if it takes it (``step``'s send half).

        Args:
            writer: The frame being written (None or done: nothing to do).
            what: What the caller is doing, for the error message.
            close_on_error: False leaves the connection open after a failed send, so that the
                caller can still read what the peer sent before it left (``Channel``).

        Raises:
            PeerDisconnectedError: The peer closed or reset the connection.
        """
        if writer is None or writer.done:
            return False, False, False
        try:
            count = self._sock.send(writer.chunk())
        except ssl.SSLWantReadError:
            return False, True, False
        except _WOULD_BLOCK:
            return False, False, True
        except OSError as exc:
            if close_on_error:
                self._fail()
            raise PeerDisconnectedError(
                f"sending to {self.peer_name} failed while {what} ({type(exc).__name__}: "
                f"{exc}); it closed the connection"
            ) from exc
        writer.advance(count)
        self.wire_bytes_sent += count
        return True, False, False

    def recv_step(self, reader: FrameReader | None, what: str) -> tuple[bool, bool, bool]:
        """Read what has arrived of ``reader``'s frame (``step``'s receive half).

        Reads until the socket is drained (TLS hands out one 16 KiB record per call), bounded so
        that a fast peer cannot starve our own sending. A peer that closes the connection
        between frames ended its stream; one that closes it inside a frame cut that frame short:
        the two errors say which.

        Raises:
            PeerDisconnectedError: The connection failed or the peer closed it.
            MalformedFrameError: The incoming frame broke a rule (connection closed).
        """
        progress, want_read, want_write = False, False, False
        for _ in range(_READS_PER_STEP):
            if reader is None or reader.done:
                break
            try:
                view = reader.view()
                count = self._sock.recv_into(view, len(view))
            except ssl.SSLWantWriteError:
                want_write = True
                break
            except _WOULD_BLOCK:
                want_read = True
                break
            except OSError as exc:
                self._fail()
                raise PeerDisconnectedError(
                    f"connection to {self.peer_name} failed while {what}: {exc}"
                ) from exc
            if count == 0:
                self._fail()
                raise PeerDisconnectedError(_closed_message(self.peer_name, what, reader))
            self.wire_bytes_received += count
            try:
                reader.advance(count, time.monotonic())
            except MalformedFrameError:
                self._fail()
                raise
            progress = True
        return progress, want_read, want_write

    def wait(
        self, want_read: bool, want_write: bool, seconds: float, extra: list | None = None
    ) -> list:
        """Block until the socket (or one of ``extra``) is ready, or ``seconds`` pass."""
        readers = ([self._sock] if want_read else []) + list(extra or [])
        try:
            ready, _, _ = select.select(readers, [self._sock] if want_write else [], [], seconds)
        except (OSError, ValueError) as exc:  # closed underneath us
            self._fail()
            raise PeerDisconnectedError(f"connection to {self.peer_name} closed: {exc}") from exc
        return ready

    def frame_deadline(self, reader: FrameReader) -> float | None:
        """When a frame that has started must be complete (None before its first byte)."""
        if reader.first_byte_at is None:
            return None
        return (
            reader.first_byte_at
            + self.timeout_seconds
            + reader.declared / self.min_bytes_per_second
        )

    def _deadline(
        self,
        start: float,
        send_deadline: float | None,
        writer: FrameWriter | None,
        reader: FrameReader | None,
    ) -> tuple[float, str]:
        """The earliest deadline now in force, and how to say it was missed."""
        options: list[tuple[float, str]] = []
        if writer is not None and not writer.done and send_deadline is not None:
            options.append(
                (
                    send_deadline,
                    f"{self.peer_name} did not read {writer.total} bytes within "
                    f"{send_deadline - start:.3g} s (sent {writer.sent}); it is stuck or gone",
                )
            )
        if reader is not None and not reader.done:
            if reader.first_byte_at is None:
                options.append(
                    (
                        start + self.timeout_seconds,
                        f"{self.peer_name} sent nothing for {self.timeout_seconds:g} s; it is "
                        "stuck or gone. Check both parties run the same protocol, or raise the "
                        "timeout",
                    )
                )
            else:
                allowed = self.timeout_seconds + reader.declared / self.min_bytes_per_second
                options.append(
                    (
                        reader.first_byte_at + allowed,
                        f"{self.peer_name} sent a frame too slowly: {reader.received} bytes in "
                        f"{allowed:.3g} s (a frame of {reader.declared} payload bytes must "
                        f"arrive within timeout + size / {self.min_bytes_per_second:g} B/s)",
                    )
                )
        return min(options)

    def _fail(self) -> None:
        """Close after an error: a half-read or half-written frame leaves the stream unusable."""
        self.close()

    # ---- Transport ---------------------------------------------------------------------------

    def _send(self, array: np.ndarray) -> None:
        self._pump(FrameWriter(array), None, f"sending a {array.dtype} frame")

    def _recv(self, max_bytes: int | None = None) -> np.ndarray:
        cap = self.max_frame_bytes if max_bytes is None else min(max_bytes, self.max_frame_bytes)
        reader = FrameReader(Expect(cap), self.peer_name)
        self._pump(None, reader, "waiting for a frame")
        return reader.result()

    def _exchange(self, array: np.ndarray) -> np.ndarray:
        payload = _wire_array(array)
        reader = FrameReader(Expect(payload.nbytes, payload.dtype, payload.shape), self.peer_name)
        self._pump(FrameWriter(payload), reader, "exchanging a frame")
        return reader.result()

    def send_raw(self, data: bytes) -> None:
        """Write raw bytes to the socket, bypassing framing (for tests of frame validation)."""
        self._pump(FrameWriter.raw(data), None, "sending raw bytes")

    def fileno(self) -> int:
        """The socket's file descriptor (for ``select``); -1 once closed."""
        return -1 if self._closed else self._sock.fileno()

    def pending(self) -> bool:
        """True if decrypted bytes wait inside the TLS layer (``select`` cannot see them)."""
        return (
            isinstance(self._sock, ssl.SSLSocket) and not self._closed and self._sock.pending() > 0
        )

    @property
    def closed(self) -> bool:
        """True once ``close`` was called (or an error closed the connection)."""
        return self._closed

    def peer_certificate(self) -> dict | None:
        """The peer's verified certificate (``ssl.SSLSocket.getpeercert``), None without TLS."""
        if isinstance(self._sock, ssl.SSLSocket) and not self._closed:
            return self._sock.getpeercert()
        return None

    def close(self, linger_seconds: float = 0.0, *, background: bool = False) -> None:
        """Close the connection; the peer's next receive raises.

        Args:
            linger_seconds: Half-close first and read (and drop) what the peer still sends,
                until it closes or this time passes. Closing with unread bytes makes TCP send a
                reset, which can destroy the last message (an error, a goodbye) before the
                peer reads it; lingering lets it arrive.
            background: Linger in a daemon thread and return at once.
        """
        if self._closed:
            return
        self._closed = True
        if linger_seconds > 0 and background:
            threading.Thread(
                target=self._linger_and_close, args=(linger_seconds,), daemon=True
            ).start()
            return
        self._linger_and_close(linger_seconds)

    def _linger_and_close(self, linger_seconds: float) -> None:
        sock = self._sock
        if linger_seconds > 0:
            try:
                sock.shutdown(socket.SHUT_WR)  # on TLS: drops the SSL layer, then half-closes
                end = time.monotonic() + linger_seconds
                while (left := end - time.monotonic()) > 0:
                    ready, _, _ = select.select([sock], [], [], left)
                    if not ready:
                        break
                    try:
                        if not sock.recv(1 << 16):
                            break
                    except (BlockingIOError, InterruptedError):
                        continue
            except (OSError, ValueError):
                pass
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except (OSError, ValueError):
            pass
        sock.close()


def connect_socket(host: str, port: int, timeout_seconds: float) -> socket.socket:
    """Open a TCP connection, retrying refused connects until ``timeout_seconds`` have passed."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        try:
            return socket.create_connection((host, port), timeout=timeout_seconds)
        except (ConnectionRefusedError, TimeoutError) as exc:
            if time.monotonic() > deadline:
                raise PeerDisconnectedError(
                    f"could not connect to {host}:{port} within {timeout_seconds:g} s "
                    f"({exc}); start the listening party first"
                ) from exc
            time.sleep(0.05)


class TcpListener:
    """A listening socket for the party that waits; ``port=0`` picks a free ephemeral port.

    ``accept`` takes the first connection as is (tests, trusted loopback); deployments accept
    through ``fedunlearn.mpc.link.accept_peers``, which authenticates roles and survives junk.

    Args:
        host: Address to bind (``127.0.0.1`` for loopback).
        port: Port, or 0 for an ephemeral one (read it back from ``.port``).
        ssl_context: Server-side TLS context, or None for plain TCP.
        sock: An already listening socket to use instead of binding ``host:port`` (e.g. one a
            launcher bound and handed to this process); ``host`` and ``port`` are read from it.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        ssl_context: ssl.SSLContext | None = None,
        *,
        sock: socket.socket | None = None,
    ) -> None:
        self.sock = socket.create_server((host, port)) if sock is None else sock
        self.host, self.port = self.sock.getsockname()[:2]
        self._ssl_context = ssl_context

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) to connect to."""
        return self.host, self.port

    def accept(
        self,
        *,
        party_id: int = 0,
        timeout_seconds: float = 60.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> TcpTransport:
        """Wait for the peer to connect (at most ``timeout_seconds``) and return the transport."""
        self.sock.settimeout(timeout_seconds)
        try:
            sock, address = self.sock.accept()
        except TimeoutError as exc:
            raise PeerDisconnectedError(
                f"no peer connected to {self.host}:{self.port} within {timeout_seconds:g} s"
            ) from exc
        if self._ssl_context is not None:
            sock.settimeout(timeout_seconds)
            try:
                sock = self._ssl_context.wrap_socket(sock, server_side=True)
            except (ssl.SSLError, OSError) as exc:
                sock.close()
                raise PeerDisconnectedError(f"TLS handshake with {address} failed: {exc}") from exc
        peer = f"{address[0]}:{address[1]}"
        return TcpTransport(sock, party_id, timeout_seconds, max_frame_bytes, peer_name=peer)

    def close(self) -> None:
        """Stop listening."""
        self.sock.close()
