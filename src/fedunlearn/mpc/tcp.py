"""TCP transport between two processes: length-prefixed frames, a size cap, optional TLS.

Frame: a 16-byte header ``!4sBBxxQ`` (magic ``FUMP``, dtype code, ndim, payload length), then
ndim uint64 dimensions, then the raw little-endian payload. A frame with a bad magic, an unknown
dtype, more than 8 dimensions, a payload larger than ``max_frame_bytes`` or a length that does not
match its shape raises ``MalformedFrameError`` before the payload is read, and the connection
is closed. A peer that closes, resets or stays silent past ``timeout_seconds`` raises
``PeerDisconnectedError``.

Plain TCP exchanges are full duplex (a helper thread sends while the caller receives, so two
large simultaneous sends cannot fill both socket buffers and deadlock). Over TLS the two parties
take turns instead (party 0 sends first), since one SSL object must not read and write from two
threads at once.

Paper: Starfish spec §2.1 (two non-colluding servers), §12 item 2.
"""

from __future__ import annotations

import math
import socket
import ssl
import struct
import threading
import time

import numpy as np

from fedunlearn.errors import MalformedFrameError, PeerDisconnectedError
from fedunlearn.mpc.transport import Transport

__all__ = ["DEFAULT_MAX_FRAME_BYTES", "TcpListener", "TcpTransport"]

DEFAULT_MAX_FRAME_BYTES = 1 << 30
_HEADER = struct.Struct("!4sBBxxQ")
_MAGIC = b"FUMP"
_MAX_NDIM = 8
_SMALL_FRAME = 1 << 16
_DTYPES = {1: np.dtype("<u8"), 2: np.dtype("u1"), 3: np.dtype("<i8"), 4: np.dtype("<f8")}
_CODES = {dtype.str: code for code, dtype in _DTYPES.items()}


def encode_header(array: np.ndarray) -> bytes:
    """Return the header and shape bytes that precede ``array``'s payload on the wire."""
    code = _CODES.get(array.dtype.str)
    if code is None:
        raise TypeError(f"cannot send dtype {array.dtype}; allowed: uint64, uint8, int64, float64")
    if array.ndim > _MAX_NDIM:
        raise ValueError(f"cannot send a {array.ndim}-d array; at most {_MAX_NDIM} dimensions")
    shape = struct.pack(f"!{array.ndim}Q", *array.shape)
    return _HEADER.pack(_MAGIC, code, array.ndim, array.nbytes) + shape


class TcpTransport(Transport):
    """One end of a TCP connection to the other party.

    Build one with ``TcpListener(...).accept()`` (party 0, usually) or ``TcpTransport.connect``.

    Args:
        sock: A connected socket (already wrapped if TLS is used).
        party_id: 0 or 1; decides who sends first over TLS.
        timeout_seconds: Limit for every blocking socket operation.
        max_frame_bytes: Largest payload accepted from the peer.
    """

    def __init__(
        self,
        sock: socket.socket,
        party_id: int,
        timeout_seconds: float = 60.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        super().__init__(timeout_seconds)
        self._sock = sock
        self._sock.settimeout(self.timeout_seconds)
        self.party_id = party_id
        self.max_frame_bytes = int(max_frame_bytes)
        self._tls = isinstance(sock, ssl.SSLSocket)
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
        """Connect to a listening party, retrying until ``timeout_seconds`` have passed."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            try:
                sock = socket.create_connection((host, port), timeout=timeout_seconds)
                break
            except (ConnectionRefusedError, TimeoutError) as exc:
                if time.monotonic() > deadline:
                    raise PeerDisconnectedError(
                        f"could not connect to {host}:{port} within {timeout_seconds:g} s "
                        f"({exc}); start the listening party first"
                    ) from exc
                time.sleep(0.05)
        if ssl_context is not None:
            sock = ssl_context.wrap_socket(sock, server_hostname=server_hostname or host)
        return cls(sock, party_id, timeout_seconds, max_frame_bytes)

    def _send(self, array: np.ndarray) -> None:
        payload = np.ascontiguousarray(array)
        if payload.dtype.byteorder == ">":
            payload = payload.astype(payload.dtype.newbyteorder("<"))
        try:
            header = encode_header(payload)
            if payload.nbytes <= _SMALL_FRAME:  # one write: no Nagle/delayed-ACK stall
                self._sock.sendall(header + payload.tobytes())
            else:
                self._sock.sendall(header)
                self._sock.sendall(memoryview(payload.reshape(-1)).cast("B"))
        except (TimeoutError, OSError) as exc:
            raise PeerDisconnectedError(
                f"sending to the peer failed ({type(exc).__name__}: {exc}); it closed the "
                f"connection or did not read for {self.timeout_seconds:g} s"
            ) from exc

    def _recv_exact(self, nbytes: int, what: str) -> bytearray:
        buf = bytearray(nbytes)
        view, got = memoryview(buf), 0
        while got < nbytes:
            try:
                n = self._sock.recv_into(view[got:], nbytes - got)
            except TimeoutError as exc:
                raise PeerDisconnectedError(
                    f"the peer sent nothing for {self.timeout_seconds:g} s while {what}; it is "
                    "stuck or gone. Check both parties run the same protocol, or raise the timeout."
                ) from exc
            except OSError as exc:
                message = f"connection to the peer failed while {what}: {exc}"
                raise PeerDisconnectedError(message) from exc
            if n == 0:
                raise PeerDisconnectedError(
                    f"the peer closed the connection while {what} (got {got} of {nbytes} bytes)"
                )
            got += n
        return buf

    def _recv(self) -> np.ndarray:
        header = self._recv_exact(_HEADER.size, "waiting for a frame header")
        magic, code, ndim, nbytes = _HEADER.unpack(header)
        problem = None
        if magic != _MAGIC:
            problem = f"bad magic {bytes(magic)!r} (expected {_MAGIC!r})"
        elif code not in _DTYPES:
            problem = f"unknown dtype code {code} (allowed {sorted(_DTYPES)})"
        elif ndim > _MAX_NDIM:
            problem = f"{ndim} dimensions (at most {_MAX_NDIM})"
        elif nbytes > self.max_frame_bytes:
            problem = f"payload of {nbytes} bytes exceeds max_frame_bytes={self.max_frame_bytes}"
        if problem is None:
            shape = struct.unpack(f"!{ndim}Q", self._recv_exact(8 * ndim, "reading a frame shape"))
            expected = math.prod(shape) * _DTYPES[code].itemsize
            if expected != nbytes:
                problem = f"shape {shape} needs {expected} bytes but the frame declares {nbytes}"
        if problem is not None:
            self.close()
            message = f"rejected a frame from the peer: {problem}; connection closed"
            raise MalformedFrameError(message)
        payload = self._recv_exact(nbytes, "reading a frame payload")
        return np.frombuffer(payload, dtype=_DTYPES[code]).reshape(shape)

    def _exchange(self, array: np.ndarray) -> np.ndarray:
        if self._tls:  # take turns: one SSL object, one thread at a time
            if self.party_id == 0:
                self._send(array)
                return self._recv()
            peer = self._recv()
            self._send(array)
            return peer
        errors: list[BaseException] = []

        def send() -> None:
            try:
                self._send(array)
            except BaseException as exc:  # reported to the caller below
                errors.append(exc)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        try:
            peer = self._recv()
        except BaseException:
            self.close()  # unusable now; closing also unblocks a sender stuck on a silent peer
            sender.join(self.timeout_seconds)
            raise
        sender.join(self.timeout_seconds)
        if errors:
            raise errors[0]
        return peer

    def set_timeout(self, seconds: float) -> None:
        """Change the limit for every blocking socket operation."""
        super().set_timeout(seconds)
        self._sock.settimeout(self.timeout_seconds)

    def send_raw(self, data: bytes) -> None:
        """Write raw bytes to the socket, bypassing framing (for tests of frame validation)."""
        self._sock.sendall(data)

    def close(self) -> None:
        """Shut down and close the socket; the peer's next receive raises."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


class TcpListener:
    """A listening socket for the party that waits; ``port=0`` picks a free ephemeral port.

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
        self._sock = socket.create_server((host, port)) if sock is None else sock
        self.host, self.port = self._sock.getsockname()[:2]
        self._ssl_context = ssl_context

    def accept(
        self,
        *,
        party_id: int = 0,
        timeout_seconds: float = 60.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> TcpTransport:
        """Wait for the peer to connect (at most ``timeout_seconds``) and return the transport."""
        self._sock.settimeout(timeout_seconds)
        try:
            sock, _ = self._sock.accept()
        except TimeoutError as exc:
            raise PeerDisconnectedError(
                f"no peer connected to {self.host}:{self.port} within {timeout_seconds:g} s"
            ) from exc
        if self._ssl_context is not None:
            sock.settimeout(timeout_seconds)
            sock = self._ssl_context.wrap_socket(sock, server_side=True)
        return TcpTransport(sock, party_id, timeout_seconds, max_frame_bytes)

    def close(self) -> None:
        """Stop listening."""
        self._sock.close()
