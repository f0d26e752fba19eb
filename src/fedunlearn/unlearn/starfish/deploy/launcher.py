"""Starfish's local deployment: dealer, two servers and clients as four supervised processes.

:func:`run_local` is ``fedunlearn starfish-local``: it makes the run's Stage I share stores if
needed (``shares.ensure_shares``), binds three ephemeral listening sockets on 127.0.0.1, starts
the dealer, server 0, server 1 and the simulated clients at once (:func:`launch`; each child is
one ``fedunlearn starfish-*`` command of :mod:`fedunlearn.cli.starfish`, started by module name,
so this module imports nothing above it), waits for them with a deadline, stops the others as
soon as one fails, and checks that both servers opened the same model. Bounded waits
everywhere: ``timeout_seconds`` per receive in every child, ``deadline_seconds`` for the whole
run (also the dealer's idle wait); every child is killed on the way out.

A child's options are the method's explicitly set options (:func:`option_params`: one
``key=value`` per option, the value in YAML, as ``--param`` takes it), its receive timeout and
its TLS files; the dealer gets no method options.

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Sec. III-A (two non-colluding servers and the clients), Alg. 4.
Deviations: docs/methods/starfish.md, D24 (a trusted dealer process; simulated clients).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from fedunlearn.errors import FedUnlearnError
from fedunlearn.unlearn.starfish.deploy.remote import Tls
from fedunlearn.unlearn.starfish.deploy.shares import ensure_shares
from fedunlearn.unlearn.starfish.params import StarfishExecution
from fedunlearn.unlearn.starfish.unlearner import Starfish

__all__ = [
    "CHILD_MODULE",
    "LocalRunError",
    "launch",
    "listening_socket",
    "option_params",
    "run_local",
    "spawn",
]

HOST = "127.0.0.1"
CHILD_MODULE = "fedunlearn.cli.starfish"  # ``python -m`` entry of the starfish-* commands
CHILDREN = ("dealer", "server0", "server1", "clients")


class LocalRunError(FedUnlearnError, RuntimeError):
    """A process of a local Starfish run failed or did not finish in time."""


def _yaml_value(value: Any) -> str:
    """Return ``value`` as one line of YAML that ``yaml.safe_load`` reads back unchanged."""
    plain = list(value) if isinstance(value, tuple) else value
    text = yaml.safe_dump(plain, default_flow_style=True, width=1_000_000).strip()
    return text.removesuffix("...").strip()  # a scalar document ends with "..."


def option_params(method: Starfish) -> list[str]:
    """Return ``key=value`` for every option set explicitly on ``method`` (for ``--param``)."""
    return [f"{key}={_yaml_value(value)}" for key, value in method.options().items()]


def _tls_args(tls: Tls | None) -> list[str]:
    if tls is None:
        return []
    return [f"--tls-ca={tls.ca}", f"--tls-cert={tls.cert}", f"--tls-key={tls.key}"]


def spawn(args: Sequence[str], log_file: Path, pass_fds: Sequence[int] = ()) -> subprocess.Popen:
    """Start ``fedunlearn <args>`` as a child process, stderr and stdout to ``log_file``.

    The child runs ``python -m fedunlearn.cli.starfish`` (only the starfish commands, so it
    imports less than the full CLI); ``pass_fds`` are inherited (listening sockets).
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with log_file.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", CHILD_MODULE, *args],
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
    outs: tuple[Path, Path],
    logs: Path,
    *,
    method: Starfish | None = None,
    timeout_seconds: float = 120.0,
    tls: Tls | None = None,
    dealer_idle_seconds: float = 3600.0,
) -> list[subprocess.Popen]:
    """Start dealer, server 0, server 1 and the clients at once on pre-bound ephemeral ports.

    The launcher binds the dealer's, server 0's and the clients' listening sockets itself and
    hands them to the children, so nobody waits for anybody to publish a port.

    Args:
        run_dir: The run (with its share stores).
        forget: Target client ids.
        outs: Result files of server 0 and server 1.
        logs: Directory of the children's logs (``dealer.log``, ``server0.log``, ...).
        method: Its explicitly set options go to the servers and the clients (default: none).
        timeout_seconds: How long a child's receive waits before its peer counts as gone.
        tls: Mutual TLS for every connection (default: plain TCP).
        dealer_idle_seconds: How long the dealer waits for the servers between requests.

    Returns:
        The four processes (dealer, server 0, server 1, clients); the caller must kill them.
    """
    ids = ",".join(map(str, forget))
    params = [] if method is None else [f"--param={item}" for item in option_params(method)]
    shared = [f"--timeout={timeout_seconds}", *_tls_args(tls)]
    dealer_sock, peer_sock, clients_sock = (listening_socket() for _ in range(3))
    dealer_port, peer_port, clients_port = (
        sock.getsockname()[1] for sock in (dealer_sock, peer_sock, clients_sock)
    )
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
                [
                    "starfish-dealer",
                    f"--listen-fd={dealer_sock.fileno()}",
                    *shared,
                    f"--idle-timeout={dealer_idle_seconds}",
                ],
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
                    *params,
                    *shared,
                ],
                logs / "server0.log",
                [peer_sock.fileno()],
            )
        )
        children.append(
            spawn(
                [
                    "starfish-server",
                    "--party=1",
                    *common,
                    f"--peer={HOST}:{peer_port}",
                    f"--out={outs[1]}",
                    *params,
                    *shared,
                ],
                logs / "server1.log",
            )
        )
        children.append(
            spawn(
                [
                    "starfish-clients",
                    str(run_dir),
                    f"--forget={ids}",
                    f"--listen-fd={clients_sock.fileno()}",
                    *params,
                    *shared,
                ],
                logs / "clients.log",
                [clients_sock.fileno()],
            )
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


def _stop(children: Sequence[subprocess.Popen]) -> None:
    """Kill every child still running and reap it."""
    for child in children:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)


def run_local(
    run_dir: Path,
    forget: Sequence[int],
    method: Starfish | None = None,
    *,
    timeout_seconds: float = 120.0,
    deadline_seconds: float = 900.0,
    log_dir: Path | None = None,
    tls: Tls | None = None,
) -> dict[str, Any]:
    """Run dealer, both servers and the clients as processes on 127.0.0.1; return party 0's result.

    Args:
        run_dir: A finished run (``history.policy: all``); its share stores are made if absent.
        forget: Target client ids.
        method: The Starfish options (default: every default, on the 2PC backend).
        timeout_seconds: How long a child's receive waits before its peer counts as gone.
        deadline_seconds: How long the whole run may take.
        log_dir: Where the children's logs go (default: a temporary directory).
        tls: Mutual TLS for every connection (default: plain TCP on loopback).

    Returns:
        Server 0's result (``params``, ``details``, ``costs``, link bytes) with
        ``models_agree`` and ``party1_mpc_costs`` added.

    Raises:
        LocalRunError: A process failed (its last log lines are in the message) or the run did
            not finish within ``deadline_seconds``; every child is killed on the way out.
    """
    if method is None:
        method = Starfish(execution=StarfishExecution(backend="mpc"))
    ensure_shares(run_dir, method)
    with tempfile.TemporaryDirectory(prefix="starfish-local-") as tmp_name:
        tmp = Path(tmp_name)
        logs = log_dir or tmp
        children: list[subprocess.Popen] = []
        try:
            outs = (tmp / "server0.json", tmp / "server1.json")
            children = launch(
                run_dir,
                forget,
                outs,
                logs,
                method=method,
                timeout_seconds=timeout_seconds,
                tls=tls,
                dealer_idle_seconds=deadline_seconds,
            )
            end = time.monotonic() + deadline_seconds
            while any(child.poll() is None for child in children):
                if any(child.poll() not in (None, 0) for child in children):
                    break  # one failed: stop the others now instead of waiting for timeouts
                if time.monotonic() > end:
                    raise LocalRunError(
                        f"the run did not finish within {deadline_seconds:g} s; all stopped"
                    )
                time.sleep(0.05)
            _stop(children)
            failed = [
                f"{name} exit {child.returncode}: {_tail(logs / f'{name}.log')}"
                for name, child in zip(CHILDREN, children, strict=True)
                if child.returncode != 0
            ]
            if failed:
                raise LocalRunError("; ".join(failed))
            results = [json.loads((tmp / f"server{k}.json").read_text()) for k in (0, 1)]
        finally:
            _stop(children)
    if results[0]["params"] != results[1]["params"]:
        raise LocalRunError("the two servers opened different unlearned models")
    result = results[0]
    result["models_agree"] = True
    result["party1_mpc_costs"] = results[1]["details"].get("mpc_costs", {})
    return result
