"""Starfish's processes: one server, the dealer, the simulated clients; TLS and sockets.

CLI ``fedunlearn starfish-server``, ``starfish-dealer``, ``starfish-clients``,
``starfish-local``. Each server reads only its share store and the run's public config and
talks to three peers over TCP: the other server (``TcpTransport``), the trusted dealer (D24;
``mpc.RemoteDealer``: party 0 receives 16-byte seeds only, party 1 its seed plus one
correction share per request; the dealer process is ``mpc.DealerServer`` with a fresh master
secret, see :func:`serve_dealer`) and the simulated clients (``starfish_clients``, see
:func:`serve_clients`), who send each server only its share of a fresh exact update. A lost
peer, dealer or client process raises ``PeerDisconnectedError``; the share store is opened
read-only, so a failed request changes nothing on disk and can be re-run.

Costs: the party's counters hold what crossed the sockets as payload: online bytes to the
other server, offline bytes from the dealer (seeds and corrections, as ``mpc.RemoteDealer``
charges them); ``dealer_link_bytes`` and ``clients_link_bytes`` add up each link in both
directions (requests included).

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Sec. III (two non-colluding servers, semi-honest model), Alg. 4.
Deviations (docs/methods/starfish.md, D24): offline material comes from a trusted dealer
process, not from an OT-based offline phase between the servers; TLS (``Tls``: mutual,
CA-pinned, no host-name check) is optional (the paper's servers are on a LAN;
``starfish-local`` on loopback uses plain TCP unless given one). Listening sockets may be
inherited (``listen_fd``): the launcher binds the ephemeral ports itself and starts all four
processes at once.
"""

from __future__ import annotations

import dataclasses
import secrets
import socket
import ssl
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedunlearn.errors import ConfigError, PeerDisconnectedError, SecureComputationError
from fedunlearn.history.store import HistoryStore
from fedunlearn.mpc import DealerServer, FixedPoint, Party, RemoteDealer, TcpTransport
from fedunlearn.runs import load_run_config
from fedunlearn.unlearn.base import UnlearnRequest
from fedunlearn.unlearn.context import CostMeter, MeteredHistory
from fedunlearn.unlearn.session import UnlearnSession
from fedunlearn.unlearn.starfish.backend.mpc import MpcBackend
from fedunlearn.unlearn.starfish.deploy.clients import ClientSimulator, RemoteClients, recv_json
from fedunlearn.unlearn.starfish.deploy.shares import (
    SharedStageOneRecord,
    server_context,
    share_meta,
    share_settings,
    share_store_dir,
)
from fedunlearn.unlearn.starfish.unlearner import Starfish

__all__ = [
    "Tls",
    "accept",
    "connect",
    "listen",
    "run_server",
    "serve_clients",
    "serve_dealer",
]


# ---- sockets and TLS ------------------------------------------------------------------------


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


@dataclasses.dataclass(frozen=True)
class Tls:
    """Mutual TLS for every connection (server-server, server-dealer).

    Each side presents ``cert``/``key`` and requires the other's certificate to be signed by
    ``ca`` (the deployment's own CA; host names are not checked, the CA is the trust anchor).
    """

    ca: Path
    cert: Path
    key: Path

    def context(self, server_side: bool) -> ssl.SSLContext:
        """Return the SSL context of the accepting (``server_side``) or connecting end."""
        purpose = ssl.Purpose.CLIENT_AUTH if server_side else ssl.Purpose.SERVER_AUTH
        try:
            ctx = ssl.create_default_context(purpose, cafile=str(self.ca))
            ctx.load_cert_chain(str(self.cert), str(self.key))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cannot load the TLS files (ca {self.ca}, cert {self.cert}, key {self.key}): {exc}"
            ) from exc
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


def connect(
    address: tuple[str, int], party_id: int, timeout_seconds: float, tls: Tls | None = None
) -> TcpTransport:
    """Connect to a listening party or dealer (retrying until the timeout), over TLS if given."""
    return TcpTransport.connect(
        *address,
        party_id=party_id,
        timeout_seconds=timeout_seconds,
        ssl_context=None if tls is None else tls.context(server_side=False),
    )


def accept(
    sock: socket.socket, party_id: int, timeout_seconds: float, tls: Tls | None = None
) -> TcpTransport:
    """Wait (bounded) for one connection on ``sock`` and return it as a ``TcpTransport``.

    Raises:
        PeerDisconnectedError: Nobody connected within ``timeout_seconds``, or the TLS
            handshake failed (e.g. the peer's certificate is not signed by the CA).
    """
    sock.settimeout(timeout_seconds)
    host, port = sock.getsockname()[:2]
    try:
        conn, _ = sock.accept()
    except TimeoutError as exc:
        raise PeerDisconnectedError(
            f"no peer connected to {host}:{port} within {timeout_seconds:g} s; start it, or "
            "raise --timeout"
        ) from exc
    if tls is not None:
        conn.settimeout(timeout_seconds)
        try:
            conn = tls.context(server_side=True).wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            conn.close()
            raise PeerDisconnectedError(
                f"TLS handshake with the peer on {host}:{port} failed: {exc}"
            ) from exc
    return TcpTransport(conn, party_id, timeout_seconds)


def serve_dealer(
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    port_file: Path | None = None,
    listen_fd: int | None = None,
    timeout_seconds: float = 120.0,
    idle_timeout_seconds: float = 3600.0,
    tls: Tls | None = None,
) -> int:
    """Run the trusted dealer (``mpc.DealerServer``, fresh master secret) for one session.

    Listens on ``host:port`` (0: ephemeral, published in ``port_file``) or on an inherited
    socket ``listen_fd``, serves the two servers' paired requests until both say goodbye and
    returns the number of requests served. The dealer sees request shapes only, no data.

    Raises:
        PeerDisconnectedError: A server vanished or stayed silent (the other is told).
        SecureComputationError: The servers' requests did not match.
    """
    sock = listen(host, port, port_file, listen_fd)
    server = DealerServer(
        seed=None,
        ssl_context=None if tls is None else tls.context(server_side=True),
        timeout_seconds=timeout_seconds,
        idle_timeout_seconds=idle_timeout_seconds,
        listen_socket=sock,
    )
    return server.serve()


def serve_clients(
    run_dir: str | Path,
    forget: Sequence[int],
    *,
    method: Starfish,
    host: str = "127.0.0.1",
    port: int = 0,
    port_file: Path | None = None,
    listen_fd: int | None = None,
    timeout_seconds: float = 120.0,
    tls: Tls | None = None,
) -> dict[str, Any]:
    """Serve both servers as the simulated remaining clients, then return a summary.

    Listens like :func:`serve_dealer`, accepts the two servers (each announces its party id)
    and answers their exact-update requests until both say ``bye``.

    Raises:
        PeerDisconnectedError: A server vanished mid-protocol (the other is served to its end).
    """
    request = UnlearnRequest.of(list(forget))
    with UnlearnSession(run_dir, evaluate=False) as session:
        context = session.context(request)
        simulator = ClientSimulator(
            context.clients,
            method.scale(context.clients.spec.lr),
            FixedPoint(method.execution.frac_bits),
            secrets.token_bytes(16),
            context.initial_params.dtype,
        )
        listener = listen(host, port, port_file, listen_fd)
        transports: dict[int, TcpTransport] = {}
        try:
            for _ in range(2):
                conn = accept(listener, 0, timeout_seconds, tls)
                hello = recv_json(conn)
                party_id = int(hello.get("party", -1))
                if party_id not in (0, 1) or party_id in transports:
                    conn.close()
                    raise SecureComputationError(f"bad hello from a server: {hello!r}")
                transports[party_id] = conn
        finally:
            listener.close()
        errors: dict[int, BaseException] = {}
        served = dict.fromkeys(transports, 0)

        def serve(party_id: int) -> None:
            try:
                served[party_id] = simulator.serve(transports[party_id], party_id)
            except BaseException as exc:  # reported after both threads end
                errors[party_id] = exc
            finally:
                transports[party_id].close()

        threads = [threading.Thread(target=serve, args=(k,), daemon=True) for k in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        party_id, error = sorted(errors.items())[0]
        if isinstance(error, PeerDisconnectedError):
            raise PeerDisconnectedError(f"server {party_id} disconnected: {error}") from error
        raise error
    return {"requests": served, "participations": context.meter.client_participations}


def run_server(
    party_id: int,
    run_dir: str | Path,
    forget: Sequence[int],
    *,
    method: Starfish,
    peer: tuple[str, int],
    dealer: tuple[str, int],
    clients: tuple[str, int],
    port_file: Path | None = None,
    listen_fd: int | None = None,
    timeout_seconds: float = 120.0,
    tls: Tls | None = None,
) -> dict[str, Any]:
    """Run one Starfish server: its share store, the other server, the dealer, the clients.

    Party 0 listens on ``peer`` (port 0: ephemeral, published in ``port_file``) or on an
    inherited socket ``listen_fd``; party 1 connects to it. Both connect to the dealer
    (``mpc.RemoteDealer``) and to the client simulator. The share store is opened read-only.

    Returns:
        ``{"party", "params" (list), "details", "costs", "dealer_link_bytes",
        "clients_link_bytes"}``.

    Raises:
        PeerDisconnectedError: The other server, the dealer or the clients vanished or went
            silent.
        ConfigError: The share store does not match the method's parameters.
    """
    execution = method.execution
    request = UnlearnRequest.of(list(forget))
    config = load_run_config(run_dir)
    store = HistoryStore.open(share_store_dir(run_dir, party_id))
    transport: TcpTransport | None = None
    remote: RemoteDealer | None = None
    gateway: RemoteClients | None = None
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
        remote = RemoteDealer.connect(
            *dealer,
            party_id=party_id,
            timeout_seconds=timeout_seconds,
            ssl_context=None if tls is None else tls.context(server_side=False),
        )
        if party_id == 0:
            listener = listen(peer[0], peer[1], port_file, listen_fd)
            try:
                transport = accept(listener, 0, timeout_seconds, tls)
            finally:
                listener.close()
        else:
            transport = connect(peer, 1, timeout_seconds, tls)
        party = Party(
            party_id,
            transport,
            fixed_point=FixedPoint(execution.frac_bits),
            comparison=execution.comparison,
            dealer=remote,
        )
        gateway = RemoteClients(connect(clients, party_id, timeout_seconds, tls), party)
        backend = MpcBackend(party)
        record = SharedStageOneRecord(history, party)
        out = method.replay(request, context, backend, record, gateway)
        return {
            "party": party_id,
            "params": out.params.tolist(),
            "details": out.details.to_dict(),
            "costs": meter.counts(),
            "dealer_link_bytes": _link_bytes(remote.transport),
            "clients_link_bytes": gateway.link_bytes,
        }
    finally:
        if gateway is not None:
            gateway.close()
        if remote is not None:
            remote.close()
        if transport is not None:
            transport.close()
        store.close()


def _link_bytes(transport: TcpTransport) -> int:
    snapshot = transport.counters.snapshot()
    return sum(t["bytes_sent"] + t["bytes_received"] for t in snapshot.values())
