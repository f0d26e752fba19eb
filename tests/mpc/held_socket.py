"""Hold a transport's I/O in the middle of a frame, as a descheduled I/O thread would be."""

from __future__ import annotations

import socket
import threading
import time

from fedunlearn.mpc.tcp import TcpTransport


class HeldSocket:
    """A transport's socket whose second send from now on waits for ``release``.

    A frame goes out in two sends (header and shape, then payload): holding the second is an
    I/O thread held up (descheduled on a loaded machine) in the middle of a frame.
    """

    def __init__(self, sock: socket.socket, release: threading.Event) -> None:
        self._sock, self._release, self.sends = sock, release, 0

    def send(self, data) -> int:
        self.sends += 1
        if self.sends == 2:
            self._release.wait(10.0)
        return self._sock.send(data)

    def __getattr__(self, name: str):
        return getattr(self._sock, name)


def hold_the_second_send(transport: TcpTransport, release: threading.Event) -> HeldSocket:
    """Hold ``transport``'s I/O in the middle of its next frame until ``release`` is set."""
    held = HeldSocket(transport._sock, release)
    transport._sock = held  # type: ignore[assignment]
    return held


def wait_until(condition, seconds: float = 5.0) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.001)
