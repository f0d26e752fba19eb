"""What a link demands of its peer: ``Security`` (who: a certified role, or explicit plain TCP).

``Security`` is the one choice every process of a deployment makes once and hands to every
link it opens or accepts (``link.accept_peers``, ``link.connect_peer``, ``DealerServer``,
``RemoteDealer.connect``, Starfish's deploy layer):

- ``Security(identity=Identity.from_directory(pki, "server0"))``: mutual TLS against the
  deployment's CA; a peer's role is the one its certificate binds (the secure setting);
- ``Security.plain()``: plain TCP, chosen explicitly; no peer proves its role and nothing is
  encrypted (``identity.INSECURE_WARNING``).

There is no third, implicit way: neither or both is a ``ConfigError``.

``LinkLimits`` are the time and size bounds of one link (connect, handshake, join, each
receive, the largest frame), so that a silent or hostile peer never blocks a process forever.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fedunlearn.errors import ConfigError
from fedunlearn.mpc.identity import INSECURE_WARNING, Identity, require_security
from fedunlearn.mpc.tcp import DEFAULT_MAX_FRAME_BYTES

__all__ = ["DEFAULT_LIMITS", "FIRST_BYTE_SECONDS", "LinkLimits", "Security"]

FIRST_BYTE_SECONDS = 2.0  # a connection that sends nothing for this long is closed


@dataclass(frozen=True)
class Security:
    """How one process secures its links: a TLS identity (its role), or explicitly none.

    Args:
        identity: This process's identity (the certificate binds its role): mutual TLS.
        insecure: Plain TCP, chosen explicitly (``INSECURE_WARNING``).

    Raises:
        ConfigError: Neither or both were given.
    """

    identity: Identity | None = None
    insecure: bool = False

    def __post_init__(self) -> None:
        require_security(self.identity, self.insecure, "this process")

    @classmethod
    def plain(cls) -> Security:
        """Plain TCP, explicitly: no peer authentication, no encryption."""
        return cls(insecure=True)

    @classmethod
    def from_directory(cls, directory: str | Path, role: str) -> Security:
        """The identity of ``role`` in a directory made by ``fedunlearn starfish-certs``."""
        return cls(identity=Identity.from_directory(directory, role))

    @property
    def authenticates_roles(self) -> bool:
        """True if a peer's role comes from its certificate (not from its claim)."""
        return self.identity is not None

    def require_role(self, role: str) -> None:
        """Raise ``ConfigError`` unless the identity's certificate binds ``role``."""
        if self.identity is not None and self.identity.role != role:
            raise ConfigError(
                f"this process runs as {role!r} but its certificate ({self.identity.cert}) "
                f"binds role {self.identity.role!r}; give it the {role} certificate"
            )

    def describe(self) -> str:
        """One line for logs and results."""
        if self.identity is not None:
            return f"mutual TLS, roles from certificates (this process: {self.identity.role})"
        return "plain TCP (insecure): " + INSECURE_WARNING


@dataclass(frozen=True)
class LinkLimits:
    """Time and size bounds of one link.

    Args:
        timeout_seconds: Connect retry window, and each receive on the established link.
        accept_timeout_seconds: How long a listener waits for all its expected peers.
        handshake_timeout_seconds: Bound on one connection's TLS handshake and hello.
        ready_timeout_seconds: How long a connecting peer waits for the service's other
            peers (None: ``timeout_seconds``).
        max_frame_bytes: Largest frame accepted on the established link.
        first_byte_seconds: A listener closes a connection that sends nothing for this long
            (an idle connection frees its handshake slot quickly).
        join_timeout_seconds: How long a connecting peer keeps retrying attempts that found
            no listener ready (None: ``timeout_seconds``).
    """

    timeout_seconds: float = 60.0
    accept_timeout_seconds: float = 600.0
    handshake_timeout_seconds: float = 10.0
    ready_timeout_seconds: float | None = None
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    first_byte_seconds: float = FIRST_BYTE_SECONDS
    join_timeout_seconds: float | None = None

    def __post_init__(self) -> None:
        names = ("timeout_seconds", "accept_timeout_seconds", "handshake_timeout_seconds")
        for name in (*names, "first_byte_seconds"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0 seconds; got {getattr(self, name)!r}")
        if self.max_frame_bytes < 1:
            raise ConfigError(f"max_frame_bytes must be >= 1; got {self.max_frame_bytes!r}")

    def _or_timeout(self, seconds: float | None) -> float:
        return self.timeout_seconds if seconds is None else seconds

    @property
    def ready_seconds(self) -> float:
        """How long a connecting peer waits for the service to be ready."""
        return self._or_timeout(self.ready_timeout_seconds)

    @property
    def join_seconds(self) -> float:
        """How long a connecting peer keeps retrying to join."""
        return self._or_timeout(self.join_timeout_seconds)


DEFAULT_LIMITS = LinkLimits()
