"""``fedunlearn starfish-*``: Starfish's two 2PC servers and the dealer as separate processes.

- ``starfish-share RUN``: Stage I shares of a recorded run into ``RUN/starfish/server0|1``.
- ``starfish-dealer``: the trusted dealer (``mpc.DealerServer``: seeds to party 0, seeds and
  one correction share to party 1; it sees no data).
- ``starfish-clients RUN --forget 3``: the simulated remaining clients (exact updates, shared).
- ``starfish-server --party 0|1 --run RUN --forget 3 --peer HOST:PORT --dealer HOST:PORT
  --clients HOST:PORT``: one server; party 0 listens on ``--peer`` (port 0: ephemeral, see
  ``--port-file``), party 1 connects to it.
- ``starfish-local RUN --forget 3 --out result.json``: the four processes on 127.0.0.1 with
  ephemeral ports, bounded waits, the result of both servers checked and collected.

A server that loses its peer, the dealer or the clients ends with ``PeerDisconnectedError`` and
exit code 2; its share store is only read, so the request can simply be run again.

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Sec. III, Alg. 4; Starfish spec §2.1, §4, §12 item 2.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from fedunlearn.cli.common import cli_errors, parse_forget
from fedunlearn.errors import ConfigError, FedUnlearnError, HistoryError

if TYPE_CHECKING:  # imported where used: the CLI lists its commands without loading torch
    from fedunlearn.unlearn.starfish.deploy.remote import Tls
    from fedunlearn.unlearn.starfish.unlearner import Starfish

__all__ = ["LocalRunError", "launch", "register", "run_local", "spawn"]

console = Console()
err_console = Console(stderr=True)
HOST = "127.0.0.1"


class LocalRunError(FedUnlearnError, RuntimeError):
    """A process of a local Starfish run failed or did not finish in time."""


_cli_errors = cli_errors


def _ids(text: str, run_dir: Path) -> list[int]:
    """Parse ``--forget`` as ``fedunlearn unlearn`` does: ``3,7`` or ``malicious``."""
    return parse_forget(text, run_dir)[0]


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"addresses are HOST:PORT (e.g. 127.0.0.1:0); got {text!r}")
    return host, int(port)


def _method(params: Sequence[str]) -> Starfish:
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


def ensure_shares(run_dir: Path, method: Starfish, force: bool = False) -> bool:
    """Create ``RUN/starfish/server0|1`` from the run's history unless present; return if made."""
    from fedunlearn.history.store import HistoryStore
    from fedunlearn.runs import HISTORY_DIR, load_run_config
    from fedunlearn.unlearn.starfish.deploy.shares import share_history, share_store_dir

    dirs = [share_store_dir(run_dir, k) for k in (0, 1)]
    present = [(d / "history.sqlite").exists() for d in dirs]
    if all(present) and not force:
        return False
    if any(present) and not force:
        raise HistoryError(
            f"only one of {dirs[0]} and {dirs[1]} holds a share store; re-share with --force"
        )
    for d in dirs:
        for suffix in ("", "-wal", "-shm"):
            (d / f"history.sqlite{suffix}").unlink(missing_ok=True)
    p = method.params
    config = load_run_config(run_dir)
    with HistoryStore.open(run_dir / HISTORY_DIR) as history:
        share_history(
            history,
            dirs,
            lr=config.training.lr,
            frac_bits=p.frac_bits,
            tolerance_rate=p.tolerance_rate,
            units=p.units,
        )
    return True


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


def _tls_args(tls: Tls | None) -> list[str]:
    if tls is None:
        return []
    return [f"--tls-ca={tls.ca}", f"--tls-cert={tls.cert}", f"--tls-key={tls.key}"]


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
    from fedunlearn.unlearn.starfish.deploy.shares import share_store_dir

    made = ensure_shares(run_dir, _method(param or []), force)
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
        method=_method(param or []),
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
    if party not in (0, 1):
        raise ConfigError(f"--party must be 0 or 1; got {party}")
    from fedunlearn.unlearn.starfish.deploy.remote import run_server

    _server_logging()
    result = run_server(
        party,
        run,
        _ids(forget, run),
        method=_method(param or []),
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


def spawn(args: Sequence[str], log_file: Path, pass_fds: Sequence[int] = ()) -> subprocess.Popen:
    """Start ``fedunlearn <args>`` as a child process, stderr and stdout to ``log_file``.

    The child runs ``python -m fedunlearn.cli.starfish`` (only the starfish commands, so it
    imports less than the full CLI); ``pass_fds`` are inherited (listening sockets).
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with log_file.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "fedunlearn.cli.starfish", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            pass_fds=tuple(pass_fds),
        )


def listening_socket() -> socket.socket:
    """Return an inheritable listening socket on 127.0.0.1 with an ephemeral port."""
    sock = socket.create_server((HOST, 0))
    sock.set_inheritable(True)
    return sock


def launch(
    run_dir: Path,
    forget: Sequence[int],
    extra: Sequence[str],
    outs: tuple[Path, Path],
    logs: Path,
    dealer_idle_seconds: float = 3600.0,
) -> list[subprocess.Popen]:
    """Start dealer, server 0, server 1 and the clients at once on pre-bound ephemeral ports.

    The launcher binds the dealer's, server 0's and the clients' listening sockets itself and
    hands them to the children, so nobody waits for anybody to publish a port.

    Args:
        run_dir: The run (with its share stores).
        forget: Target client ids.
        extra: Options for every child (``--timeout``, TLS); ``--param`` ones go to the
            servers and the clients only.
        outs: Result files of server 0 and server 1.
        logs: Directory of the children's logs (``dealer.log``, ``server0.log``, ...).
        dealer_idle_seconds: How long the dealer waits for the servers between requests.

    Returns:
        The four processes (dealer, server 0, server 1, clients); the caller must kill them.
    """
    ids = ",".join(map(str, forget))
    dealer_sock, peer_sock, clients_sock = (listening_socket() for _ in range(3))
    dealer_port, peer_port, clients_port = (
        sock.getsockname()[1] for sock in (dealer_sock, peer_sock, clients_sock)
    )
    dealer_extra = [arg for arg in extra if not arg.startswith("--param")]
    dealer_extra.append(f"--idle-timeout={dealer_idle_seconds}")
    children: list[subprocess.Popen] = []
    try:
        common = [
            f"--run={run_dir}",
            f"--forget={ids}",
            f"--dealer={HOST}:{dealer_port}",
            f"--clients={HOST}:{clients_port}",
        ]
        children.append(
            spawn(
                ["starfish-dealer", f"--listen-fd={dealer_sock.fileno()}", *dealer_extra],
                logs / "dealer.log",
                [dealer_sock.fileno()],
            )
        )
        children.append(
            spawn(
                [
                    "starfish-server",
                    "--party=0",
                    *common,
                    f"--peer={HOST}:{peer_port}",
                    f"--listen-fd={peer_sock.fileno()}",
                    f"--out={outs[0]}",
                    *extra,
                ],
                logs / "server0.log",
                [peer_sock.fileno()],
            )  # fmt: skip
        )
        children.append(
            spawn(
                [
                    "starfish-server",
                    "--party=1",
                    *common,
                    f"--peer={HOST}:{peer_port}",
                    f"--out={outs[1]}",
                    *extra,
                ],
                logs / "server1.log",
            )  # fmt: skip
        )
        children.append(
            spawn(
                [
                    "starfish-clients",
                    str(run_dir),
                    f"--forget={ids}",
                    f"--listen-fd={clients_sock.fileno()}",
                    *extra,
                ],
                logs / "clients.log",
                [clients_sock.fileno()],
            )  # fmt: skip
        )
    except BaseException:
        for child in children:
            child.kill()
        raise
    finally:
        for sock in (dealer_sock, peer_sock, clients_sock):
            sock.close()
    return children


def _tail(log_file: Path, lines: int = 3) -> str:
    text = log_file.read_text(errors="replace").strip().splitlines() if log_file.exists() else []
    return " | ".join(text[-lines:])


def run_local(
    run_dir: Path,
    forget: Sequence[int],
    params: Sequence[str] = (),
    timeout_seconds: float = 120.0,
    deadline_seconds: float = 900.0,
    log_dir: Path | None = None,
    tls: Tls | None = None,
) -> dict[str, Any]:
    """Run dealer, both servers and the clients as processes on 127.0.0.1; return party 0's result.

    Raises:
        LocalRunError: A process failed (its last log lines are in the message) or the run did
            not finish within ``deadline_seconds``; every child is killed on the way out.
    """
    method = _method(params)
    ensure_shares(run_dir, method)
    extra = [f"--param={p}" for p in params] + [f"--timeout={timeout_seconds}", *_tls_args(tls)]
    with tempfile.TemporaryDirectory(prefix="starfish-local-") as tmp_name:
        tmp = Path(tmp_name)
        logs = log_dir or tmp
        children: list[subprocess.Popen] = []
        try:
            outs = (tmp / "server0.json", tmp / "server1.json")
            children = launch(run_dir, forget, extra, outs, logs, deadline_seconds)
            names = ("dealer", "server0", "server1", "clients")
            end = time.monotonic() + deadline_seconds
            while any(child.poll() is None for child in children):
                if any(child.poll() not in (None, 0) for child in children):
                    break  # one failed: stop the others now instead of waiting for timeouts
                if time.monotonic() > end:
                    raise LocalRunError(
                        f"the run did not finish within {deadline_seconds:g} s; all stopped"
                    )
                time.sleep(0.05)
            for child in children:
                if child.poll() is None:
                    child.kill()
                    child.wait(timeout=10)
            failed = [
                f"{name} exit {child.returncode}: {_tail(logs / f'{name}.log')}"
                for name, child in zip(names, children, strict=True)
                if child.returncode != 0
            ]
            if failed:
                raise LocalRunError("; ".join(failed))
            results = [json.loads((tmp / f"server{k}.json").read_text()) for k in (0, 1)]
        finally:
            for child in children:
                if child.poll() is None:
                    child.kill()
                    child.wait(timeout=10)
    if results[0]["params"] != results[1]["params"]:
        raise LocalRunError("the two servers opened different unlearned models")
    result = results[0]
    result["models_agree"] = True
    result["party1_mpc_costs"] = results[1]["details"].get("mpc_costs", {})
    return result


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
    tls = _tls(tls_ca, tls_cert, tls_key)
    result = run_local(run_dir, _ids(forget, run_dir), param or [], timeout, deadline, tls=tls)
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
