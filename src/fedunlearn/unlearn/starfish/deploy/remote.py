"""Starfish's processes: one server, the dealer, the simulated clients; roles, sessions, sockets.

CLI ``fedunlearn starfish-server``, ``starfish-clients``, ``starfish-local``. Each server
reads only its share store and the run's public config and talks to three peers: the other
server, the trusted dealer (D24; ``mpc.RemoteDealer``: party 0 receives 16-byte seeds only,
party 1 its seed plus one correction share per request; the dealer process,
``fedunlearn starfish-dealer``, is ``mpc.DealerServer`` with a fresh master secret) and the
simulated clients (:func:`serve_clients`, ``clients.ClientSimulator``), who send each server
only its share of a fresh exact update. The server-server link is made first, so a mismatched
job is reported with the differing fields named (the dealer sees only a combined digest).

Every link is authenticated and bound (``Security``; docs/mpc.md, docs/security.md):

- **Roles.** With an ``Identity`` (mutual TLS, role in the certificate) server 0 accepts only
  ``server1``, the dealer only ``server0``/``server1``, the clients service only the two
  servers, each role once; every process checks the role of the peer it reaches. Plain TCP
  needs ``Security(insecure=True)`` and gives all of that up (``mpc.identity.INSECURE_WARNING``).
- **Session.** The first message on every link carries ``binding.starfish_binding`` (session
  id; digests of run config, forget set, method, public trajectory, Stage I sharing); any
  difference stops both ends with ``SessionMismatchError`` naming the fields. The dealer sees
  the session id and one combined digest.
- **No ideal functionality.** ``comparison: ideal`` is refused before any work
  (``binding.check_deployable``).

Streamed offline phase: each server's ``MpcBackend`` runs with ``stream_rounds``: a replayed
round is declared to the dealer as a plan copied from the last round of the same public kind,
and its material is streamed and expanded before the round starts (booked as phase
``OFFLINE``); deviations fall back to on-demand material (``RemoteDealer.plan``).

A lost peer, dealer or clients process raises ``PeerDisconnectedError`` within the receive
timeout; the share store is opened read-only, so a failed request changes nothing on disk and
can be re-run. Costs: per-phase payload counters (``details.mpc_costs``), per-round costs
(``rounds``) and each link's bytes in both directions (``links``).

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Sec. III (two non-colluding servers, semi-honest model), Alg. 4.
Deviations (docs/methods/starfish.md, D24): offline material comes from a trusted dealer
process, not from an OT-based offline phase between the servers. Listening sockets may be
inherited (``listen_fd``): the launcher binds the ephemeral ports itself and starts all four
processes at once.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedunlearn.errors import ConfigError
from fedunlearn.history.store import HistoryStore
from fedunlearn.mpc import (
    FixedPoint,
    Identity,
    Link,
    Party,
    RemoteDealer,
    accept_peer,
    accept_peers,
    connect_peer,
)
from fedunlearn.mpc.identity import INSECURE_WARNING, party_role, require_security
from fedunlearn.runs import load_run_config
from fedunlearn.unlearn.base import UnlearnRequest
from fedunlearn.unlearn.context import CostMeter, MeteredHistory
from fedunlearn.unlearn.session import UnlearnSession
from fedunlearn.unlearn.starfish.backend.mpc import MpcBackend
from fedunlearn.unlearn.starfish.deploy.binding import (
    check_deployable,
    read_sharing,
    starfish_binding,
)
from fedunlearn.unlearn.starfish.deploy.clients import ClientSimulator, RemoteClients
from fedunlearn.unlearn.starfish.deploy.shares import (
    SharedStageOneRecord,
    server_context,
    share_meta,
    share_settings,
    share_store_dir,
)
from fedunlearn.unlearn.starfish.unlearner import Starfish

__all__ = ["Security", "listen", "run_server", "serve_clients"]


@dataclass(frozen=True)
class Security:
    """How one process secures its links: a TLS identity (its role), or explicitly none.

    Args:
        identity: This process's identity (``mpc.Identity``; the certificate binds its role).
        insecure: Plain TCP, chosen explicitly: no peer proves its role and nothing is
            encrypted (``INSECURE_WARNING``).

    Raises:
        ConfigError: Neither or both were given.
    """

    identity: Identity | None = None
    insecure: bool = False

    def __post_init__(self) -> None:
        require_security(self.identity, self.insecure, "a Starfish process")

    @classmethod
    def from_directory(cls, directory: str | Path, role: str) -> Security:
        """The identity of ``role`` in a directory made by ``fedunlearn starfish-certs``."""
        return cls(identity=Identity.from_directory(directory, role))

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
        return "plain TCP (--insecure): " + INSECURE_WARNING

    def options(self) -> dict[str, Any]:
        """Keyword arguments of the mpc link functions."""
        return {"identity": self.identity, "insecure": self.insecure}


def _write_port(port_file: Path | None, port: int) -> None:
    """Publish an ephemeral port atomically (write, then rename)."""
    if port_file is None:
        return
    tmp = port_file.with_name(port_file.name + ".tmp")
    tmp.write_text(str(port))
    tmp.replace(port_file)


def listen(
    host: str, port: int, port_file: Path | None = None, listen_fd: int | None = None
) -> socket.socket:
    """Return a listening socket: an inherited one (``listen_fd``) or a new one on host:port.

    A new socket's port (ephemeral when ``port`` is 0) is published in ``port_file``.
    """
    if listen_fd is not None:
        sock = socket.socket(fileno=listen_fd)
    else:
        sock = socket.create_server((host, port))
    _write_port(port_file, sock.getsockname()[1])
    return sock


def _link_bytes(transport: Any) -> dict[str, int]:
    return {"sent": int(transport.wire_bytes_sent), "received": int(transport.wire_bytes_received)}


def serve_clients(
    run_dir: str | Path,
    forget: Sequence[int],
    *,
    method: Starfish,
    session_id: str,
    security: Security,
    host: str = "127.0.0.1",
    port: int = 0,
    port_file: Path | None = None,
    listen_fd: int | None = None,
    timeout_seconds: float = 120.0,
    idle_timeout_seconds: float = 3600.0,
) -> dict[str, Any]:
    """Serve both servers as the simulated remaining clients, then return a summary.

    Listens on ``host:port`` (or the inherited socket ``listen_fd``), waits for the
    authenticated ``server0`` and ``server1`` of this session (at most ``timeout_seconds``)
    and answers their identical exact-update requests (``ClientSimulator``) until both say
    ``bye``.

    Raises:
        ConfigError: ``comparison: ideal``, a certificate of another role, a bad session id.
        SessionMismatchError: A server runs another session or job.
        PeerDisconnectedError: A server vanished mid-protocol (the other is told).
        SecureComputationError: The servers' requests differ or are not answerable.
    """
    check_deployable(method)
    security.require_role("clients")
    request = UnlearnRequest.of(list(forget))
    with UnlearnSession(run_dir, evaluate=False) as session:
        context = session.context(request)
        binding = starfish_binding(
            session_id,
            config=session.run_view.config,
            forget=request.forget,
            method=method,
            history=session.run_view.store,
            sharing=read_sharing(run_dir),
        )
        remaining = set(context.clients.ids)
        participants = {
            r: sorted(
                rec.client_id
                for rec in session.run_view.store.client_records(r)
                if rec.status == "accepted" and rec.client_id in remaining
            )
            for r in range(1, context.num_rounds + 1)
        }
        simulator = ClientSimulator(
            context.clients,
            method.scale(context.clients.spec.lr),
            FixedPoint(method.execution.frac_bits),
            context.initial_params.dtype,
            initial_model=context.initial_params,
            participants=participants,
            max_models=math.ceil(method.params.selection_rate * context.num_rounds) + 1,
        )
        listener = listen(host, port, port_file, listen_fd)
        try:
            links = accept_peers(
                listener,
                role="clients",
                peer_roles={"server0", "server1"},
                binding=binding,
                options={"frac_bits": method.execution.frac_bits},
                timeout_seconds=idle_timeout_seconds,
                accept_timeout_seconds=timeout_seconds,
                **security.options(),
            )
        finally:
            listener.close()
        try:
            served = simulator.serve(links)
        finally:
            for link in links.values():
                link.transport.close(1.0)
    return {
        "requests": served,
        "models": len(simulator.trajectory),
        "participations": context.meter.costs.client_participations,
    }


def run_server(
    party_id: int,
    run_dir: str | Path,
    forget: Sequence[int],
    *,
    method: Starfish,
    session_id: str,
    security: Security,
    peer: tuple[str, int],
    dealer: tuple[str, int],
    clients: tuple[str, int],
    port_file: Path | None = None,
    listen_fd: int | None = None,
    timeout_seconds: float = 120.0,
    idle_timeout_seconds: float = 3600.0,
    stream_rounds: bool = True,
) -> dict[str, Any]:
    """Run one Starfish server: its share store, the other server, the dealer, the clients.

    Party 0 listens on ``peer`` (port 0: ephemeral, published in ``port_file``) or on an
    inherited socket ``listen_fd`` and waits for the authenticated server 1 of this session;
    party 1 connects to it. Then both connect to the dealer (``mpc.RemoteDealer``) and to the
    clients service. The share store is opened read-only.

    Args:
        party_id: 0 or 1.
        run_dir: The run (its public config and ``RUN/starfish/server<party_id>``).
        forget: Target client ids.
        method: The Starfish options (the same at both servers and the clients).
        session_id: The session every process of this job was started with.
        security: This server's identity (role ``server<party_id>``) or insecure.
        peer: Party 0: where to listen; party 1: where server 0 listens.
        dealer: The dealer's address.
        clients: The clients service's address.
        port_file: Party 0 with port 0: where to publish the bound port.
        listen_fd: Party 0: an inherited listening socket.
        timeout_seconds: Connect and join windows, and each receive from the other server
            and the dealer.
        idle_timeout_seconds: Each receive from the clients (they train in between).
        stream_rounds: Plan each replayed round with the dealer (streamed offline phase).

    Returns:
        ``{"party", "session", "security", "params" (list), "details", "costs", "rounds"
        (per replayed round: kind, streamed, requests, costs per phase), "links" (bytes sent
        and received on the server, dealer and clients links: payload and wire)}``.

    Raises:
        PeerDisconnectedError: The other server, the dealer or the clients vanished or went
            silent.
        SessionMismatchError: A peer runs another session or job (fields named).
        PeerAuthenticationError: A peer is not who its link requires.
        ConfigError: The share store does not match the method's parameters, ``comparison:
            ideal``, or a certificate of another role.
    """
    if party_id not in (0, 1):
        raise ConfigError(f"party_id must be 0 or 1; got {party_id!r}")
    check_deployable(method)
    role = party_role(party_id)
    security.require_role(role)
    execution = method.execution
    request = UnlearnRequest.of(list(forget))
    config = load_run_config(run_dir)
    store = HistoryStore.open(share_store_dir(run_dir, party_id))
    party: Party | None = None
    remote: RemoteDealer | None = None
    gateway: RemoteClients | None = None
    link: Link | None = None
    finished = False
    try:
        meter = CostMeter()
        history = MeteredHistory(store, meter)
        info = share_meta(history)
        wanted = share_settings(method)
        stored = {key: info[key] for key in wanted}
        if stored != wanted:
            raise ConfigError(
                f"the share store was made with {stored}; the request asks for {wanted}. Use "
                "the store's values or re-share the run (fedunlearn starfish-share --force)."
            )
        context = server_context(history, config, request.forget, meter)
        method.check_history(context)
        binding = starfish_binding(
            session_id,
            config=config,
            forget=request.forget,
            method=method,
            history=store,
            sharing=info,
        )
        options = {"frac_bits": execution.frac_bits}
        if party_id == 0:
            listener = listen(peer[0], peer[1], port_file, listen_fd)
            try:
                link = accept_peer(
                    listener,
                    role=role,
                    peer_role="server1",
                    binding=binding,
                    options=options,
                    party_id=0,
                    timeout_seconds=timeout_seconds,
                    accept_timeout_seconds=timeout_seconds,
                    **security.options(),
                )
            finally:
                listener.close()
        else:
            link = connect_peer(
                peer,
                role=role,
                peer_roles={"server0"},
                binding=binding,
                options=options,
                party_id=1,
                timeout_seconds=timeout_seconds,
                **security.options(),
            )
        remote = RemoteDealer.connect(
            *dealer,
            party_id=party_id,
            binding=binding,
            timeout_seconds=timeout_seconds,
            **security.options(),
        )
        party = Party(
            party_id,
            link.transport,
            fixed_point=FixedPoint(execution.frac_bits),
            comparison=execution.comparison,
            dealer=remote,
        )
        clients_link = connect_peer(
            clients,
            role=role,
            peer_roles={"clients"},
            binding=binding,
            options=options,
            party_id=party_id,
            timeout_seconds=timeout_seconds,
            **security.options(),
        )
        clients_link.transport.set_timeout(idle_timeout_seconds)
        gateway = RemoteClients(clients_link, party, int(info["num_params"]))
        backend = MpcBackend(
            party,
            max_aggregate_norm=execution.norm_range[1],
            norm_range=execution.norm_range,
            stream_rounds=stream_rounds,
        )
        record = SharedStageOneRecord(history, party)
        out = method.replay(request, context, backend, record, gateway)
        finished = True
        online = link.transport.counters.online
        return {
            "party": party_id,
            "session": session_id,
            "security": security.describe(),
            "params": out.params.tolist(),
            "details": out.details.to_dict(),
            "costs": meter.counts(),
            "rounds": backend.round_costs,
            "links": {
                "server": {
                    "payload_sent": int(online.bytes_sent),
                    "payload_received": int(online.bytes_received),
                    **_link_bytes(link.transport),
                },
                "dealer": _link_bytes(remote.transport),
                "clients": gateway.link_bytes,
            },
        }
    finally:
        if gateway is not None:
            gateway.close(goodbye=finished)  # a failed server just hangs up ...
        if remote is not None and not finished:
            remote.close(goodbye=False)  # ... on the dealer too: its session ends in an error
        if party is not None:
            party.close()  # the transport to the other server and the dealer's goodbye
        else:
            if remote is not None:
                remote.close()
            if link is not None:
                link.transport.close()
        store.close()
