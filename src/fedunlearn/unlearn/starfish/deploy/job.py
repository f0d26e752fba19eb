"""What a Starfish deployment runs and how: ``StarfishJob`` and ``DeployOptions``.

Three values travel from the ``starfish-*`` commands through the launcher to each process
(``remote.run_server``, ``remote.serve_clients``), instead of one keyword per setting:

- ``StarfishJob``: *what* is being unlearned, the same at every process of one session: the
  run directory, the targets, the method's options and the session id. Its ``binding`` is the
  session binding of the job (``binding.starfish_binding``: digests of the run config, forget
  set, method, public trajectory and Stage I sharing), computed by each process from what it
  holds.
- ``DeployOptions``: *how* one process runs: its bounds (a receive's timeout, the wait for
  peers that compute in between), where it listens (``Listen``), where it finds its peers,
  and whether the servers stream the offline phase.
- ``mpc.Security``: *who* it is (a TLS identity binding its role) or, explicitly, plain TCP.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedunlearn.config import RunConfig
from fedunlearn.errors import ConfigError
from fedunlearn.mpc import SessionBinding
from fedunlearn.unlearn.base import UnlearnRequest
from fedunlearn.unlearn.starfish.deploy.binding import (
    PublicHistory,
    check_deployable,
    starfish_binding,
)
from fedunlearn.unlearn.starfish.unlearner import Starfish

__all__ = ["Address", "DeployOptions", "Listen", "StarfishJob"]

Address = tuple[str, int]


@dataclass(frozen=True)
class StarfishJob:
    """One unlearning job of a deployment, the same at the servers, the clients (and launcher).

    Args:
        run_dir: The finished run (its config, history and ``RUN/starfish`` share stores).
        forget: Target client ids.
        method: The Starfish options (``backend: mpc``; ``comparison: ideal`` is refused).
        session_id: The id every process of this session is started with.

    Raises:
        ConfigError: ``comparison: ideal`` (``binding.check_deployable``).
    """

    run_dir: Path
    forget: tuple[int, ...]
    method: Starfish
    session_id: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "run_dir", Path(self.run_dir))
        object.__setattr__(self, "forget", tuple(int(c) for c in self.forget))
        check_deployable(self.method)

    def request(self) -> UnlearnRequest:
        """The unlearning request of the job."""
        return UnlearnRequest.of(list(self.forget))

    def binding(
        self, config: RunConfig, history: PublicHistory, sharing: Mapping[str, Any]
    ) -> SessionBinding:
        """The session binding of this job, from what the calling process holds.

        Args:
            config: The run's configuration.
            history: The public models and participant records (a server's share store, or
                the run's history at the clients).
            sharing: The Stage I sharing record.
        """
        return starfish_binding(
            self.session_id,
            config=config,
            forget=self.request().forget,
            method=self.method,
            history=history,
            sharing=sharing,
        )


@dataclass(frozen=True)
class Listen:
    """Where a service listens: an inherited socket, or host:port (port 0: ephemeral).

    Args:
        host: Address to bind (0.0.0.0: every interface).
        port: Port, 0 for an ephemeral one (published in ``port_file``).
        port_file: Where to publish the bound port (written, then renamed).
        listen_fd: An inherited listening socket (the launcher binds ports itself).
    """

    host: str = "127.0.0.1"
    port: int = 0
    port_file: Path | None = None
    listen_fd: int | None = None

    def open(self) -> socket.socket:
        """Return the listening socket; a new one's port is published in ``port_file``."""
        if self.listen_fd is not None:
            sock = socket.socket(fileno=self.listen_fd)
        else:
            sock = socket.create_server((self.host, self.port))
        if self.port_file is not None:
            tmp = self.port_file.with_name(self.port_file.name + ".tmp")
            tmp.write_text(str(sock.getsockname()[1]))
            tmp.replace(self.port_file)
        return sock


@dataclass(frozen=True)
class DeployOptions:
    """How one process of a deployment runs (its job is ``StarfishJob``).

    Args:
        timeout_seconds: Connect and join windows, and each receive from the other server and
            the dealer: how long a silent peer counts as alive.
        idle_timeout_seconds: Each wait for a peer that computes in between (the servers'
            next request at the dealer and the clients; the clients' answer at a server).
        listen: Where this process listens (the dealer, the clients, server 0).
        peers: Where a server finds the others: ``{"peer": server 0's address (server 1
            connects there), "dealer": ..., "clients": ...}``.
        stream_rounds: The servers plan each replayed round with the dealer (streamed
            offline phase).
    """

    timeout_seconds: float = 120.0
    idle_timeout_seconds: float = 3600.0
    listen: Listen = field(default_factory=Listen)
    peers: Mapping[str, Address] = field(default_factory=dict)
    stream_rounds: bool = True

    def __post_init__(self) -> None:
        for name in ("timeout_seconds", "idle_timeout_seconds"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0 seconds; got {getattr(self, name)!r}")
        unknown = set(self.peers) - {"peer", "dealer", "clients"}
        if unknown:
            raise ConfigError(f"peers are 'peer', 'dealer' and 'clients'; got {sorted(unknown)}")

    def peer(self, name: str) -> Address:
        """The address of peer ``name`` (``peer``, ``dealer`` or ``clients``).

        Raises:
            ConfigError: It was not given.
        """
        if name not in self.peers:
            raise ConfigError(f"a Starfish server needs the {name}'s address (HOST:PORT)")
        return self.peers[name]
