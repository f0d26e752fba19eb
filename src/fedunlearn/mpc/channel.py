"""A framed connection driven by its own I/O thread: queued sends, buffered receives.

The dealer streams material ahead of use, so its links must read and write at the same time
(the dealer pushes material while a server sends requests or gives up a plan). One SSL object
must not be used by two threads at once, so a ``Channel`` gives the connection to a single I/O
thread that does both, in non-blocking mode (``TcpTransport.step``): ``send`` queues a frame
and wakes the thread; frames that arrive are turned into items by ``on_frame`` (e.g. dealer
material expanded into shares, in the I/O thread, ahead of use) and queued for ``receive``.

Backpressure: at most ``max_buffered_bytes`` of received items wait in the queue; beyond that
the thread stops reading, the peer's sends block in TCP, and a dealer producing ahead pauses.
An error on the connection (the peer gone, a bad frame) is delivered to the next ``receive``
as the exception it was; ``receive`` with a timeout raises ``PeerDisconnectedError`` on silence.

The dealer's service and its client stream offline material through it ahead of the
online phase (docs/mpc.md).
"""

from __future__ import annotations

import collections
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from fedunlearn.errors import FedUnlearnError, PeerDisconnectedError
from fedunlearn.mpc.tcp import Expect, FrameReader, FrameWriter, TcpTransport

__all__ = ["Channel"]

_STOP = object()
_STOP_SECONDS = 5.0  # how long a caller waits for an I/O thread that stops without draining


class Channel:
    """A ``TcpTransport`` owned by one I/O thread.

    Args:
        transport: The connected transport (the channel takes it over; do not use it directly).
        expect: Called before each incoming frame: its cap (and dtype/shape if known).
        on_frame: Turns a received array into (item for ``receive``, its size in bytes for
            the buffer limit), or None to queue nothing (a frame that is only part of an
            item). Without it the array itself is queued. Runs in the I/O thread and may
            raise (the error reaches ``receive``).
        max_buffered_bytes: Received bytes that may wait for ``receive`` before reading pauses.
        write_timeout_seconds: How long one outgoing frame may wait for the peer to read it.
        name: Thread name.
    """

    def __init__(
        self,
        transport: TcpTransport,
        *,
        expect: Callable[[], Expect],
        on_frame: Callable[[np.ndarray], tuple[Any, int] | None] | None = None,
        max_buffered_bytes: int = 1 << 30,
        write_timeout_seconds: float = 3600.0,
        name: str = "channel",
    ) -> None:
        self.transport = transport
        self._expect = expect
        self._on_frame = on_frame
        self.max_buffered_bytes = int(max_buffered_bytes)
        self.write_timeout_seconds = float(write_timeout_seconds)
        self._out: collections.deque[np.ndarray] = collections.deque()
        self._out_lock = threading.Lock()
        self._out_bytes = 0
        self._in: queue.Queue = queue.Queue()
        self._buffered = 0
        self._buffer_lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._closing = False
        self._drain = False  # on close: write what was queued before stopping
        self._linger = 0.0  # on close: how long to wait for the peer to hang up
        self._close_lock = threading.Lock()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ---- caller side ---------------------------------------------------------------------------

    def send(self, array: np.ndarray) -> None:
        """Queue ``array`` for sending (returns at once).

        Raises:
            PeerDisconnectedError: The channel failed or was closed.
        """
        if self._error is not None:
            raise self._error  # the reason the channel stopped, as receive reports it
        if self._closing:
            raise PeerDisconnectedError(f"the channel to {self.transport.peer_name} is closed")
        with self._out_lock:
            self._out.append(array)
            self._out_bytes += array.nbytes
        self._wake()

    def receive(self, timeout_seconds: float | None) -> Any:
        """Return the next item (``on_frame``'s result), in arrival order.

        Raises:
            PeerDisconnectedError: Nothing arrived within ``timeout_seconds``, or the peer left.
            FedUnlearnError: What ``on_frame`` or the connection raised.
        """
        try:
            item, size = self._in.get(timeout=timeout_seconds)
        except queue.Empty:
            raise PeerDisconnectedError(
                f"{self.transport.peer_name} sent nothing for {timeout_seconds:g} s; it is stuck "
                "or gone"
            ) from None
        if item is _STOP:
            self._in.put((_STOP, 0))  # every later receive fails the same way
            raise self._error or PeerDisconnectedError("the channel is closed")
        with self._buffer_lock:
            self._buffered -= size
        self._wake()  # reading may resume
        return item

    def queued_bytes(self) -> int:
        """Payload bytes queued for sending and not yet written."""
        with self._out_lock:
            return self._out_bytes

    def buffered_bytes(self) -> int:
        """Bytes of received items waiting for ``receive``."""
        with self._buffer_lock:
            return self._buffered

    def flush(self, timeout_seconds: float) -> bool:
        """Wait until every queued frame was written; return False on timeout or failure."""
        end = time.monotonic() + timeout_seconds
        while time.monotonic() < end:
            with self._out_lock:
                empty = not self._out and not self._writing
            if empty or self._error is not None:
                return self._error is None
            time.sleep(0.005)
        return False

    def close(self, flush_seconds: float = 0.0, *, background: bool = False) -> None:
        """Stop the I/O thread and close the connection.

        The I/O thread owns the socket to the end and closes it itself: a closing thread that
        shut the socket down while the I/O thread was still writing (held up on a loaded
        machine) would cut a frame in two, which the peer reads as a truncated frame and a lost
        connection (docs/mpc.md, "How a stream ends").

        Args:
            flush_seconds: If positive, wait at most this long for the frames queued before the
                close to be written (a process may exit next); the I/O thread finishes them in
                any case (a frame already begun is never cut; each is bounded by the write
                timeout), then lingers this long for the peer to close (``TcpTransport.close``),
                so the last message arrives. Zero: stop at once (after a failure).
            background: Return once the queued frames are written (or ``flush_seconds`` have
                passed); the I/O thread lingers and closes on its own.
        """
        if flush_seconds > 0 and not self._closing:
            self.flush(flush_seconds)
        with self._close_lock:
            if not self._closing:
                self._linger = max(float(flush_seconds), 0.0)
                self._drain = flush_seconds > 0
                self._closing = True
        self._wake()
        if not background:
            self._thread.join(self._linger + _STOP_SECONDS)

    @property
    def failed(self) -> BaseException | None:
        """The error that stopped the channel, if any."""
        return self._error

    # ---- the I/O thread ------------------------------------------------------------------------

    _writing = False

    def _wake(self) -> None:
        with self._close_lock:  # the I/O thread closes the wake-up pair when it ends
            if self._wake_w.fileno() < 0:
                return
            try:
                self._wake_w.send(b"\0")
            except (BlockingIOError, OSError):
                pass  # a wake-up is already pending

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _run(self) -> None:
        transport = self.transport
        writer: FrameWriter | None = None
        reader: FrameReader | None = None
        written_at = 0.0
        # a failed send: the peer is gone, but what it sent before it left (a goodbye) is in
        # the socket; it is read and delivered before the failure is reported
        send_error: PeerDisconnectedError | None = None
        try:
            while not self._closing or (self._drain and (writer is not None or self._out)):
                if writer is None and send_error is None:
                    writer = self._next_writer()
                    written_at = time.monotonic()
                with self._buffer_lock:
                    room = self._buffered < self.max_buffered_bytes
                if reader is None and room:
                    reader = FrameReader(self._expect(), transport.peer_name)
                try:
                    sent, want_read, want_write = transport.send_step(
                        writer, "streaming", close_on_error=False
                    )
                except PeerDisconnectedError as exc:
                    send_error, writer = exc, None
                    sent, want_read, want_write = False, False, False
                try:
                    got, read_more, write_first = transport.recv_step(reader, "streaming")
                except FedUnlearnError:
                    if send_error is not None:
                        raise send_error from None
                    raise
                if writer is not None and writer.done:
                    with self._out_lock:
                        self._out_bytes -= writer.payload_bytes
                        self._writing = bool(self._out)
                    writer = None
                if reader is not None and reader.done:
                    self._deliver(reader.result())
                    reader = None
                if sent or got:
                    continue
                if send_error is not None:  # everything the peer sent has been read
                    raise send_error
                self._wait(
                    writer, written_at, reader, want_read or read_more, want_write or write_first
                )
            if send_error is not None:
                raise send_error
        except FedUnlearnError as exc:
            self._error = exc
        except Exception as exc:  # delivered to the caller, never lost in a thread
            self._error = PeerDisconnectedError(f"channel to {transport.peer_name} failed: {exc}")
            self._error.__cause__ = exc
        finally:
            failed = self._error is not None
            if self._error is None:
                self._error = PeerDisconnectedError(
                    f"the channel to {transport.peer_name} is closed"
                )
            self._writing = False
            self._in.put((_STOP, 0))
            # this thread closes the connection: no frame it was writing is cut by another
            transport.close(0.0 if failed else self._linger)
            with self._close_lock:
                for sock in (self._wake_r, self._wake_w):
                    sock.close()

    def _next_writer(self) -> FrameWriter | None:
        """Take the next queued frame to write, if any."""
        with self._out_lock:
            if not self._out:
                return None
            array = self._out.popleft()
            self._writing = True
        self.transport.counters.charge(sent=array.nbytes, messages=1, rounds=1)
        return FrameWriter(array)

    def _deliver(self, array: np.ndarray) -> None:
        """Turn a received frame into an item (``on_frame``) and queue it for ``receive``."""
        self.transport.counters.charge(received=array.nbytes, rounds=1)
        if self._on_frame is None:
            made: tuple[Any, int] | None = (array, array.nbytes)
        else:
            made = self._on_frame(array)
        if made is not None:
            with self._buffer_lock:
                self._buffered += made[1]
            self._in.put(made)

    def _wait(
        self,
        writer: FrameWriter | None,
        written_at: float,
        reader: FrameReader | None,
        want_read: bool,
        want_write: bool,
    ) -> None:
        """Block until the socket or a wake-up is ready, or a deadline fails the channel."""
        transport = self.transport
        now = time.monotonic()
        deadline = now + 1.0
        if writer is not None:
            due = (
                written_at
                + self.write_timeout_seconds
                + writer.total / transport.min_bytes_per_second
            )
            if now >= due:
                raise PeerDisconnectedError(
                    f"{transport.peer_name} did not read a frame of {writer.total} bytes "
                    f"within {due - written_at:.3g} s; it is stuck or gone"
                )
            deadline = min(deadline, due)
        if reader is not None and (frame_due := transport.frame_deadline(reader)) is not None:
            if now >= frame_due:
                raise PeerDisconnectedError(
                    f"{transport.peer_name} sent a frame too slowly: {reader.received} "
                    f"bytes of a frame of {reader.declared} payload bytes by its deadline"
                )
            deadline = min(deadline, frame_due)
        if reader is not None and transport.pending():
            return
        ready = transport.wait(
            want_read and reader is not None, want_write, deadline - now, [self._wake_r]
        )
        if self._wake_r in ready:
            self._drain_wake()
