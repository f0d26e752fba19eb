"""Starfish's local deployment: dealer, two servers and clients as four supervised processes.

:func:`run_local` is ``fedunlearn starfish-local``: it makes the run's Stage I share stores if
needed (``shares.ensure_shares``), creates a fresh trial CA and one certificate per role in a
temporary directory (``mpc.create_trial_pki``; or uses the given ``pki`` directory; plain TCP
only with ``insecure=True``), draws a session id, binds three ephemeral listening sockets on
127.0.0.1, starts the dealer, server 0, server 1 and the simulated clients at once
(:func:`launch`; each child is one ``fedunlearn starfish-*`` command of
:mod:`fedunlearn.unlearn.starfish.cli`, started by module name), waits for them with a
deadline (:func:`supervise`), and checks that both servers opened the same model. When one
child fails, the others get ``GRACE_SECONDS`` to end by themselves (a lost peer ends them with
one line and exit 2 within a second) before they are killed; the error names the child that
failed first and its real exit status (a signal by name), and says which children
``starfish-local`` stopped itself (issue 41: every child used to read ``exit -9`` and the
first one listed was blamed). Bounded waits everywhere: ``timeout_seconds`` per receive in
every child, ``deadline_seconds`` for the whole run (also the dealer's and the clients' idle
wait); every child is killed on the way out.

A child's options are the method's explicitly set options (:func:`option_params`: one
``key=value`` per option, the value in YAML, as ``--param`` takes it), the session id, its
receive timeout and its security: ``--tls-dir`` of a directory holding only the CA
certificate and that role's certificate and key (:func:`role_directories`; no child holds
another role's key or the CA key), or ``--insecure``; the dealer gets no method options.

Where a local run departs from a deployment of the paper (a trusted dealer process,
simulated clients): SF24 in docs/methods/starfish.md.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from fedunlearn.errors import ConfigError, FedUnlearnError
from fedunlearn.mpc import create_trial_pki
from fedunlearn.mpc.key_files import check_private_directory, check_private_key
from fedunlearn.unlearn.starfish.deploy.binding import new_session_id
from fedunlearn.unlearn.starfish.deploy.job import DeployOptions, StarfishJob
from fedunlearn.unlearn.starfish.deploy.shares import ensure_shares
from fedunlearn.unlearn.starfish.params import StarfishExecution
from fedunlearn.unlearn.starfish.unlearner import Starfish

__all__ = [
    "CHILD_MODULE",
    "CHILDREN",
    "child_commands",
    "exit_status",
    "LocalRunError",
    "launch",
    "listening_socket",
    "option_params",
    "role_directories",
    "run_local",
    "spawn",
    "supervise",
]

HOST = "127.0.0.1"
CHILD_MODULE = "fedunlearn.unlearn.starfish.cli"  # ``python -m`` entry of the starfish-* commands
CHILDREN = ("dealer", "server0", "server1", "clients")
GRACE_SECONDS = 5.0  # after a failure, how long the others may take to end by themselves
POLL_SECONDS = 0.02


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


def role_directories(pki: Path, into: Path) -> dict[str, Path]:
    """Give each role a directory of its own: the CA certificate, its certificate, its key.

    ``pki`` holds every role's files and the CA key (``fedunlearn starfish-certs``); a child
    is started with its role's directory only, so no process holds another role's key or the
    CA key. Directories are 0700 and keys 0600, whatever the umask.

    Returns:
        Role -> directory, for every child (``CHILDREN``).

    Raises:
        ConfigError: A role's certificate or key is missing from ``pki``, or ``pki`` or a key
            in it is another user's or accessible to group or others (``chmod 700 pki``,
            ``chmod 600 pki/<role>.key``; ``mpc.identity.check_private_directory``).
    """
    check_private_directory(pki)
    into.mkdir(parents=True, exist_ok=True)
    os.chmod(into, 0o700)
    out: dict[str, Path] = {}
    for role in CHILDREN:
        directory = into / role
        directory.mkdir(exist_ok=True)
        os.chmod(directory, 0o700)
        for name, mode in (("ca.pem", 0o644), (f"{role}.pem", 0o644), (f"{role}.key", 0o600)):
            source = pki / name
            if not source.is_file():
                raise ConfigError(
                    f"{source} is missing; make the PKI directory with `fedunlearn starfish-certs`"
                )
            if name.endswith(".key"):
                check_private_key(source)
            shutil.copyfile(source, directory / name)
            os.chmod(directory / name, mode)
        out[role] = directory
    return out


def _security_args(tls: Mapping[str, Path] | None, role: str) -> list[str]:
    """``--tls-dir=DIR`` with only ``role``'s files, or ``--insecure``."""
    return ["--insecure"] if tls is None else [f"--tls-dir={tls[role]}"]


def spawn(args: Sequence[str], log_file: Path, pass_fds: Sequence[int] = ()) -> subprocess.Popen:
    """Start ``fedunlearn <args>`` as a child process, stderr and stdout to ``log_file``.

    The child runs ``python -m fedunlearn.unlearn.starfish.cli`` (only the starfish commands, so it
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


def child_commands(
    job: StarfishJob,
    outs: tuple[Path, Path],
    sockets: dict[str, socket.socket],
    tls: Mapping[str, Path] | None,
    options: DeployOptions,
) -> dict[str, tuple[list[str], list[int]]]:
    """Return each child's ``fedunlearn`` arguments and inherited descriptors, by name.

    Args:
        job: The run (with its share stores), targets, method and session id; the method's
            explicitly set options go to the servers and the clients.
        outs: Result files of server 0 and server 1.
        sockets: Listening sockets of ``dealer``, ``server0`` (for server 1) and ``clients``.
        tls: Each role's own TLS directory (``role_directories``: the CA certificate, the
            role's certificate and key, nothing else); None runs plain TCP (``--insecure``).
        options: ``timeout_seconds``: how long a child's receive waits before its peer counts
            as gone; ``idle_timeout_seconds``: how long the dealer and the clients wait for
            the servers' next request (and the servers for the clients).

    Returns:
        ``{name: (args, pass_fds)}`` for dealer, server0, server1 and clients.
    """
    ids = ",".join(map(str, job.forget))
    params = [f"--param={item}" for item in option_params(job.method)]
    timeout = f"--timeout={options.timeout_seconds}"
    idle = f"--idle-timeout={options.idle_timeout_seconds}"
    session = f"--session={job.session_id}"
    port = {name: sock.getsockname()[1] for name, sock in sockets.items()}
    fd = {name: sock.fileno() for name, sock in sockets.items()}
    server = [
        "starfish-server",
        f"--run={job.run_dir}",
        f"--forget={ids}",
        session,
        f"--dealer={HOST}:{port['dealer']}",
        f"--clients={HOST}:{port['clients']}",
        f"--peer={HOST}:{port['server0']}",
        idle,
        timeout,
        *params,
    ]
    return {
        "dealer": (
            [
                "starfish-dealer",
                f"--listen-fd={fd['dealer']}",
                idle,
                timeout,
                *_security_args(tls, "dealer"),
            ],
            [fd["dealer"]],
        ),
        "server0": (
            [
                *server,
                "--party=0",
                f"--listen-fd={fd['server0']}",
                f"--out={outs[0]}",
                *_security_args(tls, "server0"),
            ],
            [fd["server0"]],
        ),
        "server1": (
            [*server, "--party=1", f"--out={outs[1]}", *_security_args(tls, "server1")],
            [],
        ),
        "clients": (
            [
                "starfish-clients",
                str(job.run_dir),
                f"--forget={ids}",
                session,
                f"--listen-fd={fd['clients']}",
                idle,
                timeout,
                *params,
                *_security_args(tls, "clients"),
            ],
            [fd["clients"]],
        ),
    }


def launch(
    job: StarfishJob,
    outs: tuple[Path, Path],
    logs: Path,
    tls: Mapping[str, Path] | None,
    options: DeployOptions,
) -> list[subprocess.Popen]:
    """Start dealer, server 0, server 1 and the clients at once on pre-bound ephemeral ports.

    The launcher binds the dealer's, server 0's and the clients' listening sockets itself and
    hands them to the children, so nobody waits for anybody to publish a port. Arguments as
    :func:`child_commands`; ``logs`` is the directory of the children's logs
    (``dealer.log``, ``server0.log``, ...).

    Returns:
        The four processes (dealer, server 0, server 1, clients); the caller must kill them.
    """
    sockets = {name: listening_socket() for name in ("dealer", "server0", "clients")}
    commands = child_commands(job, outs, sockets, tls, options)
    children: list[subprocess.Popen] = []
    try:
        for name in CHILDREN:
            args, fds = commands[name]
            children.append(spawn(args, logs / f"{name}.log", fds))
    except BaseException:
        for child in children:
            child.kill()
        raise
    finally:
        for sock in sockets.values():
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


def exit_status(code: int) -> str:
    """A child's exit status in words: ``exit 2``, or ``killed by SIGKILL`` for a signal."""
    if code >= 0:
        return f"exit {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def supervise(
    children: Mapping[str, subprocess.Popen],
    logs: Path,
    deadline_seconds: float,
    grace_seconds: float | None = None,
) -> None:
    """Wait for every child to end; raise ``LocalRunError`` naming the first that failed.

    The children are polled every ``POLL_SECONDS`` in the order they ended. Once one has
    failed (a non-zero status), the others get ``grace_seconds`` to end by themselves (a
    lost peer ends them with one ``error:`` line and exit 2); those still running then are
    killed and reported as stopped by ``starfish-local``, not as failures. Every child has
    ended when this returns or raises.

    Args:
        children: Name -> process (``CHILDREN`` order).
        logs: The directory of the children's logs (``<name>.log``: their last lines go
            into the error).
        deadline_seconds: How long the whole run may take.
        grace_seconds: How long the others may take to end after the first failure
            (default ``GRACE_SECONDS``).

    Raises:
        LocalRunError: ``<name> failed first (exit 2: ...)``, then each other child's status
            and whether it was stopped; or the deadline passed (all stopped).
    """
    grace = GRACE_SECONDS if grace_seconds is None else grace_seconds
    ended: list[str] = []  # in the order the polls saw them end
    end = time.monotonic() + deadline_seconds
    first_failure: float | None = None
    stopped: list[str] = []
    try:
        while len(ended) < len(children):
            for name, child in children.items():
                if name not in ended and child.poll() is not None:
                    ended.append(name)
                    if child.returncode != 0 and first_failure is None:
                        first_failure = time.monotonic()
            if len(ended) == len(children):
                break
            now = time.monotonic()
            if first_failure is not None and now > first_failure + grace:
                stopped = [name for name in children if name not in ended]
                break
            if now > end:
                raise LocalRunError(
                    f"the run did not finish within {deadline_seconds:g} s; all stopped"
                )
            time.sleep(POLL_SECONDS)
    finally:
        _stop(list(children.values()))
    failed = [name for name in ended if children[name].returncode != 0]
    if not failed:
        return
    first, *others = failed
    parts = [
        f"{first} failed first ({exit_status(children[first].returncode)}: "
        f"{_tail(logs / f'{first}.log')})"
    ]
    parts += [
        f"then {name} ({exit_status(children[name].returncode)}: {_tail(logs / f'{name}.log', 1)})"
        for name in others
    ]
    if stopped:
        parts.append(f"starfish-local stopped {', '.join(stopped)} (still running)")
    raise LocalRunError("; ".join(parts))


def run_local(
    run_dir: Path,
    forget: Sequence[int],
    method: Starfish | None = None,
    *,
    timeout_seconds: float = 120.0,
    deadline_seconds: float = 900.0,
    log_dir: Path | None = None,
    pki: Path | None = None,
    insecure: bool = False,
) -> dict[str, Any]:
    """Run dealer, both servers and the clients as processes on 127.0.0.1; return party 0's result.

    Args:
        run_dir: A finished run (``history.policy: all``); its share stores are made if absent.
        forget: Target client ids.
        method: The Starfish options (default: every default, on the 2PC backend).
        timeout_seconds: How long a child's receive waits before its peer counts as gone.
        deadline_seconds: How long the whole run may take.
        log_dir: Where the children's logs go (default: a temporary directory).
        pki: A trial PKI directory (``fedunlearn starfish-certs``) to use; default: a fresh CA
            and certificates in a temporary directory, deleted afterwards.
        insecure: Plain TCP on loopback instead of mutual TLS (``INSECURE_WARNING``).

    Returns:
        Server 0's result (``params``, ``details``, ``costs``, ``rounds``, ``links``) with
        ``servers_opened_same_model`` (consistent openings; not a correct model, see
        ``details.assumptions``), ``party1_mpc_costs``, ``party1_rounds`` and
        ``party1_links`` added.

    Raises:
        ConfigError: ``comparison: ideal``, or both ``pki`` and ``insecure``.
        LocalRunError: A process failed (the first to fail is named with its exit status and
            last log lines; :func:`supervise`) or the run did not finish within
            ``deadline_seconds``; every child is killed on the way out.
    """
    if method is None:
        method = Starfish(execution=StarfishExecution(backend="mpc"))
    job = StarfishJob(Path(run_dir), tuple(forget), method, new_session_id("local"))
    options = DeployOptions(timeout_seconds=timeout_seconds, idle_timeout_seconds=deadline_seconds)
    if insecure and pki is not None:
        raise ConfigError("give a PKI directory or insecure=True, not both")
    if pki is not None:
        check_private_directory(pki)  # before the shares are made: a one-line fix first
    ensure_shares(run_dir, method)
    with tempfile.TemporaryDirectory(prefix="starfish-local-") as tmp_name:
        tmp = Path(tmp_name)
        logs = log_dir or tmp
        if not insecure and pki is None:
            pki = tmp / "pki"
            create_trial_pki(pki, hosts=[HOST, "localhost"], days=1)
        children: list[subprocess.Popen] = []
        try:
            outs = (tmp / "server0.json", tmp / "server1.json")
            tls = None if pki is None else role_directories(pki, tmp / "roles")
            children = launch(job, outs, logs, tls, options)
            supervise(dict(zip(CHILDREN, children, strict=True)), logs, deadline_seconds)
            results = [json.loads((tmp / f"server{k}.json").read_text()) for k in (0, 1)]
        finally:
            _stop(children)
    if results[0]["params"] != results[1]["params"]:
        raise LocalRunError("the two servers opened different unlearned models")
    result = results[0]
    # consistent openings, not a correct model: details.assumptions says what it rests on
    result["servers_opened_same_model"] = True
    result["party1_mpc_costs"] = results[1]["details"].get("mpc_costs", {})
    result["party1_rounds"] = results[1]["rounds"]
    result["party1_links"] = results[1]["links"]
    return result
