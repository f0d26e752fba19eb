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
peer proves its role and nothing is encrypted; a warning says so). The TLS options, the
timeouts and (servers, clients) ``--forget/--session/--param`` are declared once and shared by
the process commands (``_SharedOptionsCommand``). Each command turns its options into the three
values of ``deploy.job`` (``StarfishJob``, ``DeployOptions``) and ``mpc.Security`` and calls one
library function of ``fedunlearn.unlearn.starfish.deploy``. A server that
loses a peer ends with ``PeerDisconnectedError`` and exit code 2; its share store is only read,
so the request can simply be run again. User guide: docs/starfish.md.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import typer.main
from rich.console import Console
from typer.core import TyperCommand

from fedunlearn.cli.common import cli_errors, parse_forget, parse_params
from fedunlearn.errors import ConfigError

if TYPE_CHECKING:  # imported where used: the CLI lists its commands without loading torch
    from fedunlearn.mpc import Identity, Security
    from fedunlearn.unlearn.starfish.deploy.job import DeployOptions, StarfishJob
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


# ---- options several commands share ------------------------------------------------------------

INSECURE_HELP = (
    "plain TCP instead of mutual TLS. Gives up: peer authentication (anyone who reaches a "
    "port can claim any role and receive a server's dealer seeds or client shares) and "
    "encryption (shares, openings and seeds cross the network readable). Trusted loopback "
    "or tests only"
)
Forget = Annotated[str, typer.Option(help="comma-separated client ids to forget")]
Params = Annotated[list[str] | None, typer.Option("--param", help="starfish parameter key=value")]
Timeout = Annotated[float, typer.Option(help="seconds a receive waits before the peer is gone")]
Insecure = Annotated[bool, typer.Option("--insecure", help=INSECURE_HELP)]
Host = Annotated[
    str, typer.Option(help="address to listen on (0.0.0.0: every interface, for other hosts)")
]
Port = Annotated[int, typer.Option(help="port to listen on; 0 = ephemeral (see --port-file)")]
PortFile = Annotated[Path | None, typer.Option(help="write the bound port here")]
ListenFd = Annotated[
    int | None, typer.Option(help="listen on this inherited socket (set by starfish-local)")
]


def _tls_options(
    tls_dir: Annotated[
        Path | None,
        typer.Option(help="directory made by starfish-certs: this process uses its role's files"),
    ] = None,
    tls_ca: Annotated[
        Path | None, typer.Option(help="TLS: the deployment's CA certificate")
    ] = None,
    tls_cert: Annotated[Path | None, typer.Option(help="TLS: this process's certificate")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="TLS: this process's private key")] = None,
    insecure: Insecure = False,
) -> None:
    """Declare how a process secures its links (``--tls-dir``, ``--tls-*``, ``--insecure``)."""


def _timeout_options(
    timeout: Timeout = 120.0,
    idle_timeout: Annotated[
        float,
        typer.Option(
            help="seconds to wait for a peer that computes in between (the servers' next "
            "request; at a server: the clients' answer, they train)"
        ),
    ] = 3600.0,
) -> None:
    """Declare a process's bounds (``--timeout``, ``--idle-timeout``)."""


def _job_options(
    forget: Forget,
    session: Annotated[
        str, typer.Option(help="session id: the same for every process of this job")
    ],
    param: Params = None,
) -> None:
    """Declare the job of a server or the clients (``--forget``, ``--session``, ``--param``)."""


def _peer_options(
    peer: Annotated[str, typer.Option(help="party 0: HOST:PORT to listen on; 1: to connect")],
    dealer: Annotated[str, typer.Option(help="dealer HOST:PORT")],
    clients: Annotated[str, typer.Option(help="clients service HOST:PORT")],
) -> None:
    """Declare where a server finds its peers (``--peer``, ``--dealer``, ``--clients``)."""


def _options_of(*declarations: Callable[..., None]) -> list[Any]:
    """The options typer makes of ``declarations``' parameters (fresh objects on every call).

    Typer builds them, so they are right for whichever typer (and click) is installed.
    """
    params: list[Any] = []
    for declaration in declarations:
        app = typer.Typer(add_completion=False)
        app.command()(declaration)
        params.extend(typer.main.get_command(app).params)
    return params


class _SharedOptionsCommand(TyperCommand):
    """A command with option groups declared once (``_tls_options`` ...), shared by several.

    The groups' values do not reach the command function as arguments: ``invoke`` moves them to
    ``ctx.meta``, where ``_shared`` reads them. So each group is declared once and no command
    function takes ten parameters.
    """

    groups: tuple[Callable[..., None], ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shared = _options_of(*self.groups)
        self.params.extend(self._shared)

    # typer runs its commands with a typer.Context (click.Context in the stub of the base)
    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]
        """Move the shared options' values from the function's arguments to ``ctx.meta``."""
        ctx.meta[_META] = {option.name: ctx.params.pop(option.name) for option in self._shared}
        return super().invoke(ctx)


class _DealerCommand(_SharedOptionsCommand):
    groups = (_timeout_options, _tls_options)


class _ClientsCommand(_SharedOptionsCommand):
    groups = (_job_options, _timeout_options, _tls_options)


class _ServerCommand(_SharedOptionsCommand):
    groups = (_peer_options, _job_options, _timeout_options, _tls_options)


_META = "fedunlearn.starfish"  # ctx.meta key of the shared options' values


def _shared(ctx: typer.Context, name: str) -> Any:
    """The value of a shared option of the running command (``_SharedOptionsCommand``)."""
    return ctx.meta[_META][name]


def _path(ctx: typer.Context, name: str) -> Path | None:
    value = _shared(ctx, name)
    return None if value is None else Path(value)


def _identity(ctx: typer.Context, role: str) -> Identity | None:
    """The process's TLS identity from the shared TLS options, or None with ``--insecure``.

    Imports only ``fedunlearn.mpc`` (no torch): the dealer starts in a fraction of a second.

    Raises:
        ConfigError: Not exactly one way was chosen, or the certificate binds another role.
    """
    from fedunlearn.mpc import Identity
    from fedunlearn.mpc.identity import INSECURE_WARNING

    tls_dir, insecure = _path(ctx, "tls_dir"), bool(_shared(ctx, "insecure"))
    ca, cert, key = (_path(ctx, name) for name in ("tls_ca", "tls_cert", "tls_key"))
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
        if ca is None or cert is None or key is None:
            raise ConfigError("TLS needs all of --tls-ca, --tls-cert and --tls-key")
        identity = Identity.load(ca, cert, key)
    if identity.role != role:
        raise ConfigError(
            f"the {role} process was given a certificate ({identity.cert}) that binds role "
            f"{identity.role!r}; give it the {role} certificate"
        )
    return identity


def _security(ctx: typer.Context, role: str) -> Security:
    """``mpc.Security`` of a process from the shared TLS options (see ``_identity``)."""
    from fedunlearn.mpc import Security

    identity = _identity(ctx, role)
    return Security.plain() if identity is None else Security(identity=identity)


def _job(ctx: typer.Context, run_dir: Path) -> StarfishJob:
    """``StarfishJob`` of the shared job options (``--forget``, ``--session``, ``--param``)."""
    from fedunlearn.unlearn.starfish.deploy.job import StarfishJob

    forget = _ids(_shared(ctx, "forget"), run_dir)
    method = starfish_method(list(_shared(ctx, "param") or []))
    return StarfishJob(run_dir, tuple(forget), method, _shared(ctx, "session"))


def _options(
    ctx: typer.Context,
    listen: tuple[str, int],
    port_file: Path | None,
    listen_fd: int | None,
    stream_rounds: bool = True,
) -> DeployOptions:
    """``DeployOptions`` of the shared timeouts and peers, and where this process listens."""
    from fedunlearn.unlearn.starfish.deploy.job import DeployOptions, Listen

    names = [name for name in ("peer", "dealer", "clients") if name in ctx.meta[_META]]
    return DeployOptions(
        timeout_seconds=_shared(ctx, "timeout"),
        idle_timeout_seconds=_shared(ctx, "idle_timeout"),
        listen=Listen(listen[0], listen[1], port_file, listen_fd),
        peers={name: _address(_shared(ctx, name)) for name in names},
        stream_rounds=stream_rounds,
    )


# ---- commands ---------------------------------------------------------------------------------


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
    ctx: typer.Context,
    host: Host = "127.0.0.1",
    port: Port = 0,
    port_file: PortFile = None,
    listen_fd: ListenFd = None,
) -> None:
    """Serve the two Starfish servers as the trusted dealer (seeds and corrections only).

    ``mpc.DealerServer`` with a fresh master secret: keeps accepting until the authenticated
    server 0 and server 1 joined (junk and other roles are refused and logged), checks that
    both run the same session and job, serves their paired requests and plans until both say
    goodbye. It sees request shapes only, no data. Imports no torch (starts fast).
    """
    from fedunlearn.mpc import DealerOptions, DealerServer

    security = _security(ctx, "dealer")
    options = _options(ctx, (host, port), port_file, listen_fd)
    server = DealerServer(
        security,
        listen_socket=options.listen.open(),
        options=DealerOptions(
            timeout_seconds=options.timeout_seconds,
            idle_timeout_seconds=options.idle_timeout_seconds,
            accept_timeout_seconds=options.timeout_seconds,
        ),
    )
    served = server.serve()
    err_console.print(f"dealer done: {served} requests")


@_cli_errors
def clients_command(
    ctx: typer.Context,
    run_dir: Annotated[Path, typer.Argument(help="the run (the simulated clients' data)")],
    host: Host = "127.0.0.1",
    port: Port = 0,
    port_file: PortFile = None,
    listen_fd: ListenFd = None,
) -> None:
    """Serve the two Starfish servers as the simulated remaining clients."""
    from fedunlearn.unlearn.starfish.deploy.remote import serve_clients

    security = _security(ctx, "clients")
    job, options = _job(ctx, run_dir), _options(ctx, (host, port), port_file, listen_fd)
    _server_logging()
    summary = serve_clients(job, security, options)
    err_console.print(f"clients done: {summary}")


@_cli_errors
def server_command(
    ctx: typer.Context,
    party: Annotated[int, typer.Option(help="0 (S1, listens) or 1 (S2, connects)")],
    run: Annotated[Path, typer.Option(help="run directory with RUN/starfish/server<party>")],
    out: Annotated[Path | None, typer.Option(help="write this server's result JSON")] = None,
    port_file: Annotated[Path | None, typer.Option(help="party 0: write the bound port")] = None,
    listen_fd: ListenFd = None,
    stream: Annotated[
        bool, typer.Option(help="plan each round with the dealer (streamed offline phase)")
    ] = True,
) -> None:
    """Run one Starfish 2PC server on its share store."""
    from fedunlearn.unlearn.starfish.deploy.remote import run_server

    if party not in (0, 1):
        raise ConfigError(f"--party must be 0 or 1; got {party}")
    security = _security(ctx, f"server{party}")
    job = _job(ctx, run)
    options = _options(ctx, _address(_shared(ctx, "peer")), port_file, listen_fd, stream)
    _server_logging()
    result = run_server(party, job, security, options)
    if out is not None:
        out.write_text(json.dumps(result))
    err_console.print(f"server {party} done: {len(result['details']['selected_rounds'])} rounds")


@_cli_errors
def local_command(
    run_dir: Annotated[Path, typer.Argument(help="finished run (history.policy: all)")],
    forget: Annotated[str, typer.Option(help="comma-separated client ids to forget")],
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
        f"both servers opened the same model; result in {out}"
    )
    for assumption in details.get("assumptions", []):
        console.print(f"assumes: {assumption}")


def register(app: typer.Typer) -> None:
    """Add the starfish-* commands to the ``fedunlearn`` app."""
    app.command(name="starfish-certs")(certs_command)
    app.command(name="starfish-share")(share_command)
    app.command(name="starfish-dealer", cls=_DealerCommand)(dealer_command)
    app.command(name="starfish-clients", cls=_ClientsCommand)(clients_command)
    app.command(name="starfish-server", cls=_ServerCommand)(server_command)
    app.command(name="starfish-local")(local_command)


def main() -> None:  # pragma: no cover - entry point of the spawned processes
    """Run only the starfish commands (``python -m fedunlearn.unlearn.starfish.cli``)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    register(app)
    app(prog_name="fedunlearn")


if __name__ == "__main__":  # pragma: no cover
    main()
