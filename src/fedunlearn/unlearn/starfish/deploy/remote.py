"""Starfish's processes: one server, the dealer, the simulated clients; roles, sessions, sockets.

CLI ``fedunlearn starfish-server``, ``starfish-clients``, ``starfish-local``. Each server
reads only its share store and the run's public config and talks to three peers: the other
server, the trusted dealer (SF24; ``mpc.RemoteDealer``: party 0 receives 16-byte seeds only,
party 1 its seed plus one correction share per request; the dealer process,
``fedunlearn starfish-dealer``, is ``mpc.DealerServer`` with a fresh master secret) and the
simulated clients (:func:`serve_clients`, ``clients.ClientSimulator``), who send each server
only its share of a fresh exact update. The server-server link is made first, so a mismatched
job is reported with the differing fields named (the dealer sees only a combined digest).

Each function takes the job (``job.StarfishJob``: what is unlearned), this process's
``mpc.Security`` (who it is) and its ``job.DeployOptions`` (bounds, where it listens, where
its peers are). Every link is authenticated and bound (docs/mpc.md, docs/security.md):

- **Roles.** With an ``Identity`` (mutual TLS, role in the certificate) server 0 accepts only
  ``server1``, the dealer only ``server0``/``server1``, the clients service only the two
  servers, each role once; every process checks the role of the peer it reaches. Plain TCP
  needs ``Security.plain()`` and gives all of that up (``mpc.identity.INSECURE_WARNING``).
- **Session.** The first message on every link carries ``binding.starfish_binding`` (session
  id; digests of run config, forget set, method, public trajectory, Stage I sharing); any
  difference stops both ends with ``SessionMismatchError`` naming the fields. The dealer sees
  the session id and one combined digest.
- **No ideal functionality.** ``comparison: ideal`` is refused before any work (a
  ``StarfishJob`` cannot hold it: ``binding.check_deployable``).

Streamed offline phase: each server's ``MpcBackend`` runs with ``stream_rounds``: a replayed
round is declared to the dealer as a plan copied from the last round of the same public kind,
and its material is streamed and expanded before the round starts (booked as phase
``OFFLINE``); deviations fall back to on-demand material (``RemoteDealer.plan``).

A lost peer, dealer or clients process raises ``PeerDisconnectedError`` within the receive
timeout; the share store is opened read-only, so a failed request changes nothing on disk and
can be re-run. Costs: per-phase payload counters (``details.mpc_costs``), per-round costs
(``rounds``) and each link's bytes in both directions (``links``).

Where the deployment departs from the paper (SF24 in docs/methods/starfish.md): offline
material comes from a trusted dealer process, not from an OT-based offline phase between the
servers; the clients are simulated. Listening sockets may be inherited (``listen_fd``): the
launcher binds the ephemeral ports itself and starts all four processes at once.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, cast

from fedunlearn.errors import ConfigError
from fedunlearn.history.store import HistoryStore
from fedunlearn.mpc import (
    FixedPoint,
    Link,
    LinkLimits,
    Party,
    RemoteDealer,
    Security,
    SessionBinding,
    accept_peer,
    accept_peers,
    connect_peer,
)
from fedunlearn.mpc.identity import party_role
from fedunlearn.mpc.session import Option
from fedunlearn.runs import load_run_config
from fedunlearn.unlearn.context import CostMeter, MeteredHistory
from fedunlearn.unlearn.session import UnlearnSession
from fedunlearn.unlearn.starfish.backend.mpc import MpcBackend
from fedunlearn.unlearn.starfish.deploy.binding import read_sharing
from fedunlearn.unlearn.starfish.deploy.clients import (
    ClientSimulator,
    RemoteClients,
    remaining_participants,
)
from fedunlearn.unlearn.starfish.deploy.job import DeployOptions, StarfishJob
from fedunlearn.unlearn.starfish.deploy.shares import (
    SharedStageOneRecord,
    server_context,
    share_meta,
    share_settings,
    share_store_dir,
)
from fedunlearn.unlearn.starfish.unlearner import ASSUMPTIONS, StarfishDetails

__all__ = ["run_server", "serve_clients"]


def _link_bytes(transport: Any) -> dict[str, int]:
    return {"sent": int(transport.wire_bytes_sent), "received": int(transport.wire_bytes_received)}


def serve_clients(job: StarfishJob, security: Security, options: DeployOptions) -> dict[str, Any]:
    """Serve both servers as the simulated remaining clients, then return a summary.

    Listens where ``options.listen`` says, waits for the authenticated ``server0`` and
    ``server1`` of this session (at most ``options.timeout_seconds``) and answers their
    identical exact-update requests (``ClientSimulator``) until both say ``bye``; between two
    requests it waits at most ``options.idle_timeout_seconds``.

    Raises:
        ConfigError: A certificate of another role, a bad session id.
        SessionMismatchError: A server runs another session or job.
        PeerDisconnectedError: A server vanished mid-protocol (the other is told).
        SecureComputationError: The servers' requests differ or are not answerable.
    """
    security.require_role("clients")
    method = job.method
    request = job.request()
    with UnlearnSession(job.run_dir, evaluate=False) as session:
        context = session.context(request)
        run_view = session.run_view
        binding = job.binding(run_view.config, run_view.store, read_sharing(job.run_dir))
        participants = remaining_participants(
            run_view.store, set(context.clients.client_ids), context.num_rounds
        )
        simulator = ClientSimulator(
            context.clients,
            method.scale(context.clients.spec.lr),
            FixedPoint(method.execution.frac_bits),
            context.initial_params.dtype,
            initial_model=context.initial_params,
            participants=participants,
            max_models=math.ceil(method.params.selection_rate * context.num_rounds) + 1,
        )
        listener = options.listen.open()
        try:
            links = accept_peers(
                listener,
                role="clients",
                peer_roles={"server0", "server1"},
                security=security,
                binding=binding,
                options={"frac_bits": method.execution.frac_bits},
                limits=LinkLimits(
                    timeout_seconds=options.idle_timeout_seconds,
                    accept_timeout_seconds=options.timeout_seconds,
                ),
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


def _checked_share_meta(history: MeteredHistory, method: Any) -> dict[str, Any]:
    """The share store's metadata, after checking it was made with the method's settings."""
    info = share_meta(history)
    wanted = share_settings(method)
    stored = {key: info[key] for key in wanted}
    if stored != wanted:
        raise ConfigError(
            f"the share store was made with {stored}; the request asks for {wanted}. Use "
            "the store's values or re-share the run (fedunlearn starfish-share --force)."
        )
    return info


@dataclasses.dataclass(frozen=True)
class _ServerLinks:
    """How one server opens its links: its role, identity, session binding and options."""

    role: str
    party_id: int
    security: Security
    binding: SessionBinding
    options: dict[str, Option]
    limits: LinkLimits

    def connect(self, address: tuple[str, int], peer_role: str) -> Link:
        """Connect to the service of ``peer_role`` at ``address``."""
        return connect_peer(
            address,
            role=self.role,
            peer_roles={peer_role},
            security=self.security,
            binding=self.binding,
            options=self.options,
            party_id=self.party_id,
            limits=self.limits,
        )

    def other_server(self, deploy: DeployOptions) -> Link:
        """Party 0 accepts server 1 where ``deploy.listen`` says; party 1 connects to it."""
        if self.party_id != 0:
            return self.connect(deploy.peer("peer"), "server0")
        listener = deploy.listen.open()
        try:
            return accept_peer(
                listener,
                role=self.role,
                peer_role="server1",
                security=self.security,
                binding=self.binding,
                options=self.options,
                party_id=0,
                limits=self.limits,
            )
        finally:
            listener.close()


def _links_summary(
    link: Link, remote: RemoteDealer, gateway: RemoteClients
) -> dict[str, dict[str, int]]:
    """Bytes sent and received on the server, dealer and clients links (payload and wire)."""
    online = link.transport.counters.online
    return {
        "server": {
            "payload_sent": int(online.bytes_sent),
            "payload_received": int(online.bytes_received),
            **_link_bytes(link.transport),
        },
        "dealer": _link_bytes(remote.transport),
        "clients": gateway.link_bytes,
    }


def run_server(
    party_id: int, job: StarfishJob, security: Security, options: DeployOptions
) -> dict[str, Any]:
    """Run one Starfish server: its share store, the other server, the dealer, the clients.

    Party 0 listens where ``options.listen`` says (port 0: ephemeral, published in its
    ``port_file``; or an inherited socket) and waits for the authenticated server 1 of this
    session; party 1 connects to ``options.peers["peer"]``. Then both connect to the dealer
    (``mpc.RemoteDealer``) and to the clients service. The share store is opened read-only.

    Args:
        party_id: 0 or 1.
        job: The run (its public config and ``RUN/starfish/server<party_id>``), targets,
            Starfish options (the same at both servers and the clients) and session id.
        security: This server's identity (role ``server<party_id>``) or explicitly plain TCP.
        options: ``timeout_seconds`` bounds the connect and join windows and each receive
            from the other server and the dealer; ``idle_timeout_seconds`` each receive from
            the clients (they train in between); ``peers`` the dealer's and the clients'
            addresses (and server 0's, for party 1); ``stream_rounds`` plans each replayed
            round with the dealer.

    Returns:
        ``{"party", "session", "security", "params" (list), "details", "costs", "rounds"
        (per replayed round: kind, streamed, requests, costs per phase), "links" (bytes sent
        and received on the server, dealer and clients links: payload and wire)}``.

    Raises:
        PeerDisconnectedError: The other server, the dealer or the clients vanished or went
            silent.
        SessionMismatchError: A peer runs another session or job (fields named).
        PeerAuthenticationError: A peer is not who its link requires.
        ConfigError: The share store does not match the method's parameters, a missing peer
            address, or a certificate of another role.
    """
    role = party_role(party_id)
    security.require_role(role)
    method, execution = job.method, job.method.execution
    dealer, clients = options.peer("dealer"), options.peer("clients")
    limits = LinkLimits(
        timeout_seconds=options.timeout_seconds, accept_timeout_seconds=options.timeout_seconds
    )
    request = job.request()
    config = load_run_config(job.run_dir)
    store = HistoryStore.open(share_store_dir(job.run_dir, party_id))
    party: Party | None = None
    remote: RemoteDealer | None = None
    gateway: RemoteClients | None = None
    link: Link | None = None
    finished = False
    try:
        meter = CostMeter()
        history = MeteredHistory(store, meter)
        info = _checked_share_meta(history, method)
        context = server_context(history, config, request.forget, meter)
        method.check_history(context)
        binding = job.binding(config, store, info)
        links = _ServerLinks(
            role, party_id, security, binding, {"frac_bits": execution.frac_bits}, limits
        )
        link = links.other_server(options)
        remote = RemoteDealer.connect(
            *dealer, party_id=party_id, security=security, binding=binding, limits=limits
        )
        party = Party(
            party_id,
            link.transport,
            fixed_point=FixedPoint(execution.frac_bits),
            comparison=execution.comparison,
            dealer=remote,
        )
        clients_link = links.connect(clients, "clients")
        clients_link.transport.set_timeout(options.idle_timeout_seconds)
        gateway = RemoteClients(clients_link, party, int(info["num_params"]))
        backend = MpcBackend(
            party,
            max_aggregate_norm=execution.norm_range[1],
            norm_range=execution.norm_range,
            stream_rounds=options.stream_rounds,
        )
        record = SharedStageOneRecord(history, party, info)  # the sharing bound above
        out = method.replay(request, context, backend, record, gateway)
        finished = True
        starfish_details = cast(StarfishDetails, out.details)  # Starfish's replay returns them
        return {
            "party": party_id,
            "session": job.session_id,
            "security": security.describe(),
            "params": out.params.tolist(),
            "details": dataclasses.replace(
                starfish_details,
                assumptions=(*starfish_details.assumptions, ASSUMPTIONS["simulated_clients"]),
            ).to_dict(),
            "costs": meter.counts(),
            "rounds": backend.round_costs,
            "links": _links_summary(link, remote, gateway),
        }
    finally:
        _hang_up(gateway, remote, party, link, finished)
        store.close()


def _hang_up(
    gateway: RemoteClients | None,
    remote: RemoteDealer | None,
    party: Party | None,
    link: Link | None,
    finished: bool,
) -> None:
    """Close what ``run_server`` opened: with goodbyes if it finished, hanging up if not."""
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
