"""``fedunlearn starfish-*``: Starfish's two 2PC servers, the dealer and the clients as processes.

- ``starfish-share RUN``: Stage I shares of a recorded run into ``RUN/starfish/server0|1``.
- ``starfish-dealer``: the trusted dealer (``mpc.DealerServer``: seeds to party 0, seeds and
  one correction share to party 1; it sees no data).
- ``starfish-clients RUN --forget 3``: the simulated remaining clients (exact updates, shared).
- ``starfish-server --party 0|1 --run RUN --forget 3 --peer HOST:PORT --dealer HOST:PORT
  --clients HOST:PORT``: one server; party 0 listens on ``--peer`` (port 0: ephemeral, see
  ``--port-file``), party 1 connects to it.
- ``starfish-local RUN --forget 3 --out result.json``: the four processes on 127.0.0.1 with
  ephemeral ports, bounded waits, the result of both servers checked and collected.

Each command parses its options and calls one library function of
``fedunlearn.unlearn.starfish.deploy`` (``shares.ensure_shares``, ``remote.serve_dealer``,
``remote.serve_clients``, ``remote.run_server``, ``launcher.run_local``). A server that loses
its peer, the dealer or the clients ends with ``PeerDisconnectedError`` and exit code 2; its
share store is only read, so the request can simply be run again. User guide:
docs/starfish.md.

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Sec. III-A, Alg. 4.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from fedunlearn.cli.common import cli_errors, parse_forget
from fedunlearn.errors import ConfigError

if TYPE_CHECKING:  # imported where used: the CLI lists its commands without loading torch
    from fedunlearn.unlearn.starfish.deploy.remote import Tls
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
    import yaml

    from fedunlearn.unlearn import make_method
    from fedunlearn.unlearn.starfish.unlearner import Starfish

    values: dict[str, Any] = {}
    for item in params:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--param takes key=value; got {item!r}")
        values[key.strip()] = yaml.safe_load(value)
    method = make_method("starfish", {**values, "backend": "mpc"})
    if not isinstance(method, Starfish):
        raise ConfigError(f"'starfish' is registered as {type(method).__name__}, not Starfish")
    return method


def _server_logging() -> None:
    import torch

    torch.set_num_threads(1)
    logging.getLogger("fedunlearn.unlearn.starfish.unlearner").setLevel(logging.INFO)


# ---- commands ---------------------------------------------------------------------------------


Forget = Annotated[str, typer.Option(help="comma-separated client ids to forget")]
Params = Annotated[list[str] | None, typer.Option("--param", help="starfish parameter key=value")]
Timeout = Annotated[float, typer.Option(help="seconds a receive waits before the peer is gone")]
TlsCa = Annotated[Path | None, typer.Option(help="TLS: CA certificate (PEM) both ends trust")]
TlsCert = Annotated[Path | None, typer.Option(help="TLS: this process's certificate (PEM)")]
TlsKey = Annotated[Path | None, typer.Option(help="TLS: this process's private key (PEM)")]


def _tls(ca: Path | None, cert: Path | None, key: Path | None) -> Tls | None:
    given = [p is not None for p in (ca, cert, key)]
    if not any(given):
        return None
    if not all(given):
        raise ConfigError("TLS needs all of --tls-ca, --tls-cert and --tls-key (or none)")
    from fedunlearn.unlearn.starfish.deploy.remote import Tls

    return Tls(ca, cert, key)  # type: ignore[arg-type]


ListenFd = Annotated[
    int | None, typer.Option(help="listen on this inherited socket (set by starfish-local)")
]


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
    port: Annotated[int, typer.Option(help="port on 127.0.0.1; 0 = ephemeral")] = 0,
    port_file: Annotated[Path | None, typer.Option(help="write the bound port here")] = None,
    listen_fd: ListenFd = None,
    timeout: Timeout = 120.0,
    idle_timeout: Annotated[
        float, typer.Option(help="seconds to wait for the servers between requests")
    ] = 3600.0,
    tls_ca: TlsCa = None,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
) -> None:
    """Serve the two Starfish servers as the trusted dealer (seeds and corrections only)."""
    from fedunlearn.unlearn.starfish.deploy.remote import serve_dealer


    served = serve_dealer(
        port=port,
        port_file=port_file,
        listen_fd=listen_fd,
        timeout_seconds=timeout,
        idle_timeout_seconds=idle_timeout,
        tls=_tls(tls_ca, tls_cert, tls_key),
    )
    err_console.print(f"dealer done: {served} requests")


@_cli_errors
def clients_command(
    run_dir: Annotated[Path, typer.Argument(help="the run (the simulated clients' data)")],
    forget: Forget,
    port: Annotated[int, typer.Option(help="port on 127.0.0.1; 0 = ephemeral")] = 0,
    port_file: Annotated[Path | None, typer.Option(help="write the bound port here")] = None,
    listen_fd: ListenFd = None,
    param: Params = None,
    timeout: Timeout = 120.0,
    tls_ca: TlsCa = None,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
) -> None:
    """Serve the two Starfish servers as the simulated remaining clients."""
    from fedunlearn.unlearn.starfish.deploy.remote import serve_clients


    _server_logging()
    summary = serve_clients(
        run_dir,
        _ids(forget, run_dir),
        method=starfish_method(param or []),
        port=port,
        port_file=port_file,
        listen_fd=listen_fd,
        timeout_seconds=timeout,
        tls=_tls(tls_ca, tls_cert, tls_key),
    )
    err_console.print(f"clients done: {summary}")


@_cli_errors
def server_command(
    party: Annotated[int, typer.Option(help="0 (S1, listens) or 1 (S2, connects)")],
    run: Annotated[Path, typer.Option(help="run directory with RUN/starfish/server<party>")],
    forget: Forget,
    peer: Annotated[str, typer.Option(help="party 0: HOST:PORT to listen on; 1: to connect")],
    dealer: Annotated[str, typer.Option(help="dealer HOST:PORT")],
    clients: Annotated[str, typer.Option(help="client simulator HOST:PORT")],
    out: Annotated[Path | None, typer.Option(help="write this server's result JSON")] = None,
    port_file: Annotated[Path | None, typer.Option(help="party 0: write the bound port")] = None,
    listen_fd: ListenFd = None,
    param: Params = None,
    timeout: Timeout = 120.0,
    tls_ca: TlsCa = None,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
) -> None:
    """Run one Starfish 2PC server on its share store."""
    from fedunlearn.unlearn.starfish.deploy.remote import run_server


    if party not in (0, 1):
        raise ConfigError(f"--party must be 0 or 1; got {party}")
    _server_logging()
    result = run_server(
        party,
        run,
        _ids(forget, run),
        method=starfish_method(param or []),
        peer=_address(peer),
        dealer=_address(dealer),
        clients=_address(clients),
        port_file=port_file,
        listen_fd=listen_fd,
        timeout_seconds=timeout,
        tls=_tls(tls_ca, tls_cert, tls_key),
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
    tls_ca: TlsCa = None,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
) -> None:
    """Run dealer, both servers and the clients as local processes (127.0.0.1, ephemeral ports)."""
    from fedunlearn.unlearn.starfish.deploy.launcher import run_local

    result = run_local(
        run_dir,
        _ids(forget, run_dir),
        starfish_method(param or []),
        timeout_seconds=timeout,
        deadline_seconds=deadline,
        tls=_tls(tls_ca, tls_cert, tls_key),
    )
    out.write_text(json.dumps(result))
    details = result["details"]
    console.print(
        f"selected rounds {details['selected_rounds']}; flags {details['flags']}; "
        f"both servers agree; result in {out}"
    )


def register(app: typer.Typer) -> None:
    """Add the starfish-* commands to the ``fedunlearn`` app."""
    app.command(name="starfish-share")(share_command)
    app.command(name="starfish-dealer")(dealer_command)
    app.command(name="starfish-clients")(clients_command)
    app.command(name="starfish-server")(server_command)
    app.command(name="starfish-local")(local_command)


def main() -> None:  # pragma: no cover - entry point of the spawned processes
    """Run only the starfish commands (``python -m fedunlearn.cli.starfish``)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    register(app)
    app(prog_name="fedunlearn")


if __name__ == "__main__":  # pragma: no cover
    main()
