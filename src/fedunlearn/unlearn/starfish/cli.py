"""``fedunlearn starfish-*``: Starfish's two 2PC servers, the dealer and the clients as processes.

- ``starfish-certs DIR``: a trial CA and one certificate per role (dealer, server0, server1,
  clients), each binding its role (``mpc.create_trial_pki``).
- ``starfish-share RUN``: Stage I shares of a recorded run into ``RUN/starfish/server0|1``.
- ``starfish-dealer``: the trusted dealer (``mpc.DealerServer``: seeds to party 0, seeds and
  one correction share to party 1; it sees no data).
- ``starfish-clients RUN --forget 3 --session ID``: the simulated remaining clients.
- ``starfish-server --party 0|1 --run RUN --forget 3 --session ID --peer HOST:PORT --dealer
  HOST:PORT --clients HOST:PORT``: one server; party 0 listens on ``--peer`` (port 0:
  ephemeral, see ``--port-file``), party 1 connects to it.
- ``starfish-local RUN --forget 3 --out result.json``: the four processes on 127.0.0.1 with
  fresh certificates, ephemeral ports, bounded waits, the result of both servers checked.

Every process but ``starfish-local`` needs its security: ``--tls-dir DIR`` (a directory made by
``starfish-certs``; the process uses its role's certificate), or ``--tls-ca/--tls-cert/
--tls-key`` (the certificate must bind the process's role), or ``--insecure`` (plain TCP: no
peer proves its role and nothing is encrypted; a warning says so). Each command parses its
options and calls one library function of ``fedunlearn.unlearn.starfish.deploy``. A server that
loses a peer ends with ``PeerDisconnectedError`` and exit code 2; its share store is only read,
so the request can simply be run again. User guide: docs/starfish.md.

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Sec. III-A, Alg. 4.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from fedunlearn.cli.common import cli_errors, parse_forget, parse_params
from fedunlearn.errors import ConfigError

if TYPE_CHECKING:  # imported where used: the CLI lists its commands without loading torch
    from fedunlearn.mpc import Identity
    from fedunlearn.unlearn.starfish.deploy.remote import Security
    from fedunlearn.unlearn.starfish.unlearner import Starfish

__all__ = ["register", "starfish_method"]

console = Console()
err_console = Console(stderr=True)


_cli_errors = cli_errors


def _ids(text: str, run_dir: Path) -> list[int]:
    """Parse ``--forget`` as ``fedunlearn unlearn`` does: ``3,7`` or ``malicious``."""
    return parse_forget(text, run_dir)[0]


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"addresses are HOST:PORT (e.g. 127.0.0.1:0); got {text!r}")
    return host, int(port)


def starfish_method(params: Sequence[str]) -> Starfish:
    """Return the ``starfish`` method of ``--param key=value`` items (YAML values), on 2PC."""
    from fedunlearn.unlearn.starfish.unlearner import Starfish

    return Starfish({**parse_params(params), "backend": "mpc"})


def _server_logging() -> None:
    import torch

    torch.set_num_threads(1)
    logging.getLogger("fedunlearn.unlearn.starfish.unlearner").setLevel(logging.INFO)


# ---- commands ---------------------------------------------------------------------------------


Forget = Annotated[str, typer.Option(help="comma-separated client ids to forget")]
Params = Annotated[list[str] | None, typer.Option("--param", help="starfish parameter key=value")]
Timeout = Annotated[float, typer.Option(help="seconds a receive waits before the peer is gone")]
TlsDir = Annotated[
    Path | None,
    typer.Option(help="directory made by starfish-certs: this process uses its role's files"),
]
TlsCa = Annotated[Path | None, typer.Option(help="TLS: the deployment's CA certificate (PEM)")]
TlsCert = Annotated[Path | None, typer.Option(help="TLS: this process's certificate (PEM)")]
TlsKey = Annotated[Path | None, typer.Option(help="TLS: this process's private key (PEM)")]
INSECURE_HELP = (
    "plain TCP instead of mutual TLS. Gives up: peer authentication (anyone who reaches a "
    "port can claim any role and receive a server's dealer seeds or client shares) and "
    "encryption (shares, openings and seeds cross the network readable). Trusted loopback "
    "or tests only"
)
Insecure = Annotated[bool, typer.Option("--insecure", help=INSECURE_HELP)]
Session = Annotated[str, typer.Option(help="session id: the same for every process of this job")]
IdleTimeout = Annotated[float, typer.Option(help="seconds to wait for the servers' next request")]


def _identity(
    role: str,
    tls_dir: Path | None,
    ca: Path | None,
    cert: Path | None,
    key: Path | None,
    insecure: bool,
) -> Identity | None:
    """The process's TLS identity from its options, or None with ``--insecure``.

    Imports only ``fedunlearn.mpc`` (no torch): the dealer starts in a fraction of a second.

    Raises:
        ConfigError: Not exactly one way was chosen, or the certificate binds another role.
    """
    from fedunlearn.mpc import Identity
    from fedunlearn.mpc.identity import INSECURE_WARNING

    files = [p is not None for p in (ca, cert, key)]
    chosen = [tls_dir is not None, any(files), insecure]
    if sum(chosen) != 1:
        raise ConfigError(
            f"the {role} process needs exactly one of --tls-dir DIR (make one with `fedunlearn "
            "starfish-certs DIR`), --tls-ca/--tls-cert/--tls-key, or --insecure (plain TCP: "
            "no peer proves its role and nothing is encrypted)"
        )
    if insecure:
        err_console.print(f"warning: --insecure: {INSECURE_WARNING}")
        return None
    if tls_dir is not None:
        identity = Identity.from_directory(tls_dir, role)
    else:
        if not all(files):
            raise ConfigError("TLS needs all of --tls-ca, --tls-cert and --tls-key")
        identity = Identity.load(ca, cert, key)  # type: ignore[arg-type]
    if identity.role != role:
        raise ConfigError(
            f"the {role} process was given a certificate ({identity.cert}) that binds role "
            f"{identity.role!r}; give it the {role} certificate"
        )
    return identity


def _security(
    role: str,
    tls_dir: Path | None,
    ca: Path | None,
    cert: Path | None,
    key: Path | None,
    insecure: bool,
) -> Security:
    """``deploy.remote.Security`` of a server or the clients (see ``_identity``)."""
    from fedunlearn.unlearn.starfish.deploy.remote import Security

    identity = _identity(role, tls_dir, ca, cert, key, insecure)
    return Security(identity=identity, insecure=identity is None)


Host = Annotated[
    str, typer.Option(help="address to listen on (0.0.0.0: every interface, for other hosts)")
]
Port = Annotated[int, typer.Option(help="port to listen on; 0 = ephemeral (see --port-file)")]
ListenFd = Annotated[
    int | None, typer.Option(help="listen on this inherited socket (set by starfish-local)")
]


@_cli_errors
def certs_command(
    directory: Annotated[Path, typer.Argument(help="where to write ca.pem and <role>.pem/.key")],
    hosts: Annotated[
        str, typer.Option(help="comma-separated host names and addresses of the processes")
    ] = "127.0.0.1,localhost",
    days: Annotated[int, typer.Option(help="validity in days")] = 30,
    overwrite: Annotated[bool, typer.Option(help="replace an existing CA")] = False,
) -> None:
    """Create a trial CA and one certificate per role (dealer, server0, server1, clients)."""
    from fedunlearn.mpc import create_trial_pki

    names = [h.strip() for h in hosts.split(",") if h.strip()]
    if not names:
        raise ConfigError(f"--hosts needs at least one host name or address; got {hosts!r}")
    made = create_trial_pki(directory, hosts=names, days=days, overwrite=overwrite)
    for role, identity in made.items():
        console.print(f"{role}: {identity.cert} (key {identity.key})")
    console.print(
        f"CA: {directory / 'ca.pem'} (its key {directory / 'ca.key'} can mint any role: keep it "
        "offline in a real deployment). Give each process only its own role's files."
    )


@_cli_errors
def share_command(
    run_dir: Annotated[Path, typer.Argument(help="finished run (history.policy: all)")],
    param: Params = None,
    force: Annotated[bool, typer.Option(help="replace existing share stores")] = False,
) -> None:
    """Secret-share a run's Stage I history into RUN/starfish/server0 and server1."""
    from fedunlearn.unlearn.starfish.deploy.shares import ensure_shares, share_store_dir

    made = ensure_shares(run_dir, starfish_method(param or []), force)
    where = f"{share_store_dir(run_dir, 0)} and {share_store_dir(run_dir, 1)}"
    console.print(("wrote " if made else "kept existing ") + where)


@_cli_errors
def dealer_command(
    host: Host = "127.0.0.1",
    port: Port = 0,
    port_file: Annotated[Path | None, typer.Option(help="write the bound port here")] = None,
    listen_fd: ListenFd = None,
    timeout: Timeout = 120.0,
    idle_timeout: IdleTimeout = 3600.0,
    tls_dir: TlsDir = None,
    tls_ca: TlsCa = None,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    insecure: Insecure = False,
) -> None:
    """Serve the two Starfish servers as the trusted dealer (seeds and corrections only).

    ``mpc.DealerServer`` with a fresh master secret: keeps accepting until the authenticated
    server 0 and server 1 joined (junk and other roles are refused and logged), checks that
    both run the same session and job, serves their paired requests and plans until both say
    goodbye. It sees request shapes only, no data. Imports no torch (starts fast).
    """
    import socket

    from fedunlearn.mpc import DealerServer

    identity = _identity("dealer", tls_dir, tls_ca, tls_cert, tls_key, insecure)
    if listen_fd is not None:
        sock = socket.socket(fileno=listen_fd)
    else:
        sock = socket.create_server((host, port))
    if port_file is not None:
        tmp = port_file.with_name(port_file.name + ".tmp")
        tmp.write_text(str(sock.getsockname()[1]))
        tmp.replace(port_file)
    server = DealerServer(
        seed=None,
        identity=identity,
        insecure=identity is None,
        timeout_seconds=timeout,
        idle_timeout_seconds=idle_timeout,
        accept_timeout_seconds=timeout,
        listen_socket=sock,
    )
    served = server.serve()
    err_console.print(f"dealer done: {served} requests")


@_cli_errors
def clients_command(
    run_dir: Annotated[Path, typer.Argument(help="the run (the simulated clients' data)")],
    forget: Forget,
    session: Session,
    host: Host = "127.0.0.1",
    port: Port = 0,
    port_file: Annotated[Path | None, typer.Option(help="write the bound port here")] = None,
    listen_fd: ListenFd = None,
    param: Params = None,
    timeout: Timeout = 120.0,
    idle_timeout: IdleTimeout = 3600.0,
    tls_dir: TlsDir = None,
    tls_ca: TlsCa = None,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    insecure: Insecure = False,
) -> None:
    """Serve the two Starfish servers as the simulated remaining clients."""
    from fedunlearn.unlearn.starfish.deploy.remote import serve_clients

    security = _security("clients", tls_dir, tls_ca, tls_cert, tls_key, insecure)
    _server_logging()
    summary = serve_clients(
        run_dir,
        _ids(forget, run_dir),
        method=starfish_method(param or []),
        session_id=session,
        security=security,
        host=host,
        port=port,
        port_file=port_file,
        listen_fd=listen_fd,
        timeout_seconds=timeout,
        idle_timeout_seconds=idle_timeout,
    )
    err_console.print(f"clients done: {summary}")


@_cli_errors
def server_command(
    party: Annotated[int, typer.Option(help="0 (S1, listens) or 1 (S2, connects)")],
    run: Annotated[Path, typer.Option(help="run directory with RUN/starfish/server<party>")],
    forget: Forget,
    session: Session,
    peer: Annotated[str, typer.Option(help="party 0: HOST:PORT to listen on; 1: to connect")],
    dealer: Annotated[str, typer.Option(help="dealer HOST:PORT")],
    clients: Annotated[str, typer.Option(help="clients service HOST:PORT")],
    out: Annotated[Path | None, typer.Option(help="write this server's result JSON")] = None,
    port_file: Annotated[Path | None, typer.Option(help="party 0: write the bound port")] = None,
    listen_fd: ListenFd = None,
    param: Params = None,
    timeout: Timeout = 120.0,
    idle_timeout: Annotated[
        float, typer.Option(help="seconds to wait for the clients' answer (they train)")
    ] = 3600.0,
    stream: Annotated[
        bool, typer.Option(help="plan each round with the dealer (streamed offline phase)")
    ] = True,
    tls_dir: TlsDir = None,
    tls_ca: TlsCa = None,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    insecure: Insecure = False,
) -> None:
    """Run one Starfish 2PC server on its share store."""
    from fedunlearn.unlearn.starfish.deploy.remote import run_server

    if party not in (0, 1):
        raise ConfigError(f"--party must be 0 or 1; got {party}")
    addresses = _address(peer), _address(dealer), _address(clients)
    security = _security(f"server{party}", tls_dir, tls_ca, tls_cert, tls_key, insecure)
    _server_logging()
    result = run_server(
        party,
        run,
        _ids(forget, run),
        method=starfish_method(param or []),
        session_id=session,
        security=security,
        peer=addresses[0],
        dealer=addresses[1],
        clients=addresses[2],
        port_file=port_file,
        listen_fd=listen_fd,
        timeout_seconds=timeout,
        idle_timeout_seconds=idle_timeout,
        stream_rounds=stream,
    )
    if out is not None:
        out.write_text(json.dumps(result))
    err_console.print(f"server {party} done: {len(result['details']['selected_rounds'])} rounds")


@_cli_errors
def local_command(
    run_dir: Annotated[Path, typer.Argument(help="finished run (history.policy: all)")],
    forget: Forget,
    out: Annotated[Path, typer.Option(help="result JSON")] = Path("starfish_result.json"),
    param: Params = None,
    timeout: Timeout = 120.0,
    deadline: Annotated[float, typer.Option(help="seconds for the whole run")] = 900.0,
    tls_dir: Annotated[
        Path | None,
        typer.Option(help="use this starfish-certs directory (default: fresh certificates)"),
    ] = None,
    insecure: Insecure = False,
) -> None:
    """Run dealer, both servers and the clients as local processes on 127.0.0.1.

    Mutual TLS with a fresh CA and one certificate per role, made in a temporary directory and
    deleted afterwards (or the --tls-dir certificates); plain TCP only with --insecure.
    """
    from fedunlearn.mpc.identity import INSECURE_WARNING
    from fedunlearn.unlearn.starfish.deploy.launcher import run_local

    if insecure:
        err_console.print(f"warning: --insecure: {INSECURE_WARNING}")
    result = run_local(
        run_dir,
        _ids(forget, run_dir),
        starfish_method(param or []),
        timeout_seconds=timeout,
        deadline_seconds=deadline,
        pki=tls_dir,
        insecure=insecure,
    )
    out.write_text(json.dumps(result))
    details = result["details"]
    console.print(
        f"selected rounds {details['selected_rounds']}; flags {details['flags']}; "
        f"both servers agree; result in {out}"
    )


def register(app: typer.Typer) -> None:
    """Add the starfish-* commands to the ``fedunlearn`` app."""
    app.command(name="starfish-certs")(certs_command)
    app.command(name="starfish-share")(share_command)
    app.command(name="starfish-dealer")(dealer_command)
    app.command(name="starfish-clients")(clients_command)
    app.command(name="starfish-server")(server_command)
    app.command(name="starfish-local")(local_command)


def main() -> None:  # pragma: no cover - entry point of the spawned processes
    """Run only the starfish commands (``python -m fedunlearn.unlearn.starfish.cli``)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    register(app)
    app(prog_name="fedunlearn")


if __name__ == "__main__":  # pragma: no cover
    main()
