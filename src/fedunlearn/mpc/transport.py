"""Message passing between the two servers, with byte and round counters.

A ``Transport`` moves numpy arrays to the other party and counts what it moves, split into an
offline and an online phase, as the paper reports costs (Tables I-II). Counted bytes are payload
bytes (the paper's accounting: elements times 64 bits); frame headers and TLS records are not
counted (MPC10 in docs/mpc.md). A round is
one ``exchange`` (both parties send at once), or one one-way ``send``/``recv``.

``InProcessTransport.pair()`` connects two parties running in threads of one process (tests);
``fedunlearn.mpc.tcp.TcpTransport`` connects two processes. Both raise ``PeerDisconnectedError``
when the peer is gone or silent past the timeout, never hang.

Every ``exchange`` checks that the peer's array has the dtype and shape of the one sent (both
parties open arrays of one shape in every protocol step); anything else means the parties are
out of step and raises ``MalformedFrameError``. Only the in-process transport allows
``exchange_uncounted``, the channel of ideal functionalities (``comparison="ideal"``): over a
real connection it would hand the peer a share it must not see.

docs/performance.md compares these counters with the paper's Tables I-II (time and
communication) and Table V (rounds and bits per functionality).
"""

from __future__ import annotations

import queue
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from fedunlearn.errors import ConfigError, MalformedFrameError, PeerDisconnectedError

__all__ = ["Counters", "InProcessTransport", "Traffic", "Transport"]

PHASES = ("offline", "online")


@dataclass
class Traffic:
    """What one party sent and received in one phase."""

    bytes_sent: int = 0
    bytes_received: int = 0
    rounds: int = 0
    messages: int = 0


@dataclass
class Counters:
    """Per-party traffic split into the offline and online phase; ``phase`` is the current one."""

    offline: Traffic = field(default_factory=Traffic)
    online: Traffic = field(default_factory=Traffic)
    phase: str = "online"

    def charge(
        self,
        *,
        sent: int = 0,
        received: int = 0,
        rounds: int = 0,
        messages: int = 0,
        phase: str | None = None,
    ) -> None:
        """Add traffic to ``phase`` (default: the current phase)."""
        traffic = self.offline if (phase or self.phase) == "offline" else self.online
        traffic.bytes_sent += sent
        traffic.bytes_received += received
        traffic.rounds += rounds
        traffic.messages += messages

    @contextmanager
    def in_phase(self, phase: str) -> Iterator[None]:
        """Charge party-to-party traffic inside the block to ``phase``."""
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}; got {phase!r}")
        previous, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = previous

    def snapshot(self) -> dict[str, dict[str, int]]:
        """Return the counts as a plain dict, e.g. for results.json or a test comparison."""
        return {p: dict(vars(getattr(self, p))) for p in PHASES}


class Transport(ABC):
    """Counts messages to and from the other party; subclasses move the bytes.

    Args:
        timeout_seconds: How long a receive waits before the peer counts as gone.

    Attributes:
        supports_ideal: Whether ideal functionalities may run over this transport (only the
            in-process test transport, where both "parties" are threads of one process).
    """

    supports_ideal = False

    def __init__(self, timeout_seconds: float = 60.0) -> None:
        self.timeout_seconds = float(timeout_seconds)
        self.counters = Counters()

    def set_timeout(self, seconds: float) -> None:
        """Change how long a receive waits before the peer counts as gone."""
        self.timeout_seconds = float(seconds)

    def send(self, array: np.ndarray) -> None:
        """Send one array to the peer (one round)."""
        self._send(array)
        self.counters.charge(sent=array.nbytes, rounds=1, messages=1)

    def recv(self, max_bytes: int | None = None) -> np.ndarray:
        """Receive one array from the peer (one round).

        Args:
            max_bytes: Largest payload this step expects (the protocol knows it, e.g. a seed is
                16 bytes); a larger frame is rejected before it is read. Default: the
                transport's own cap.
        """
        array = self._recv(max_bytes)
        self.counters.charge(received=array.nbytes, rounds=1)
        return array

    def exchange(self, array: np.ndarray) -> np.ndarray:
        """Send ``array`` and receive the peer's array of the same round (one round).

        Raises:
            MalformedFrameError: The peer's array has another dtype or shape (out of step).
        """
        peer = self._exchange(array)
        _check_same(array, peer)
        self.counters.charge(sent=array.nbytes, received=peer.nbytes, rounds=1, messages=1)
        return peer

    def exchange_uncounted(self, array: np.ndarray) -> np.ndarray:
        """Exchange without counting: only for ideal functionalities that charge their own cost.

        Raises:
            ConfigError: On any transport but the in-process test transport.
        """
        if not self.supports_ideal:
            raise ConfigError(
                f"ideal functionalities (comparison='ideal') hand the peer this party's share; "
                f"refused on {type(self).__name__}. Use comparison='real' (the default) outside "
                "in-process tests and cost sweeps."
            )
        peer = self._exchange(array)
        _check_same(array, peer)
        return peer

    def _exchange(self, array: np.ndarray) -> np.ndarray:
        self._send(array)
        return self._recv(array.nbytes)

    @abstractmethod
    def _send(self, array: np.ndarray) -> None: ...

    @abstractmethod
    def _recv(self, max_bytes: int | None = None) -> np.ndarray: ...

    @abstractmethod
    def close(self) -> None:
        """Close the connection; the peer's next receive raises ``PeerDisconnectedError``."""


def _check_same(mine: np.ndarray, peer: np.ndarray) -> None:
    if peer.dtype != mine.dtype or peer.shape != mine.shape:
        raise MalformedFrameError(
            f"the peer answered an exchange of a {mine.dtype} array of shape {mine.shape} with a "
            f"{peer.dtype} array of shape {peer.shape}; the parties are out of step (both must "
            "run the same protocol on inputs of the same shapes)"
        )


_CLOSED = object()


class InProcessTransport(Transport):
    """One end of a queue pair between two threads of one process (for tests and simulation).

    Arrays are copied on send, so neither party sees the other's later in-place changes.
    """

    supports_ideal = True

    def __init__(
        self, inbox: queue.Queue, outbox: queue.Queue, timeout_seconds: float = 60.0
    ) -> None:
        super().__init__(timeout_seconds)
        self._inbox, self._outbox = inbox, outbox
        self._closed = False

    @classmethod
    def pair(cls, timeout_seconds: float = 60.0) -> tuple[InProcessTransport, InProcessTransport]:
        """Return two connected ends: one for party 0, one for party 1."""
        a_to_b: queue.Queue = queue.Queue()
        b_to_a: queue.Queue = queue.Queue()
        return cls(b_to_a, a_to_b, timeout_seconds), cls(a_to_b, b_to_a, timeout_seconds)

    def _send(self, array: np.ndarray) -> None:
        if self._closed:
            raise PeerDisconnectedError("this transport is closed; cannot send to the peer")
        self._outbox.put(np.array(array, copy=True))

    def _recv(self, max_bytes: int | None = None) -> np.ndarray:
        if self._closed:
            raise PeerDisconnectedError("this transport is closed; cannot receive from the peer")
        try:
            item = self._inbox.get(timeout=self.timeout_seconds)
        except queue.Empty:
            raise PeerDisconnectedError(
                f"the peer sent nothing for {self.timeout_seconds:g} s; it is stuck or gone. "
                "Check that both parties run the same protocol steps, or raise timeout_seconds."
            ) from None
        if item is _CLOSED:
            self._closed = True
            raise PeerDisconnectedError("the peer closed the connection mid-protocol")
        if max_bytes is not None and item.nbytes > max_bytes:
            raise MalformedFrameError(
                f"rejected a frame from the peer: {item.nbytes} bytes exceed the cap of "
                f"{max_bytes} bytes for this message"
            )
        return item

    def close(self) -> None:
        """Close this end; the peer's pending or next receive raises ``PeerDisconnectedError``."""
        if not self._closed:
            self._closed = True
            self._outbox.put(_CLOSED)
