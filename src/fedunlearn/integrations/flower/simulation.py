"""Run a fedunlearn job with ``flwr run`` on Flower's Simulation Runtime, from Python.

``simulate(job, num_supernodes)`` does what a Flower user does on the command line, on a
SuperLink of its own (free port, temporary ``FLWR_HOME``), so it never touches the user's
Flower configuration or a SuperLink they run:

1. ``flower-superlink --simulation --insecure`` on ``127.0.0.1:<free port>``, with runtime
   dependency installation off (fedunlearn is already installed);
2. ``flwr run APP <connection> --run-config job.toml --federation-config "num-supernodes=N
   ..." --stream``: the app (default: ``bundle.write_app``; node ``i`` hosts client ``i``)
   runs the job; the call returns when the run ends;
3. ``flwr list --run-id`` for the final status; then the SuperLink's process group is stopped.

This is Flower's supported path (``flwr.simulation.run_simulation`` is deprecated). What the
job wrote is on disk (``FlowerJob``); a run that does not complete raises ``FlowerRunError``
with the end of its log.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedunlearn.errors import FedUnlearnError
from fedunlearn.integrations.flower.server_app import FlowerJob

OFFLINE_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
}
CONNECTION = "fedunlearn-simulation"
START_TIMEOUT_S = 60.0


class FlowerRunError(FedUnlearnError, RuntimeError):
    """A Flower run did not complete (it failed, was stopped, or timed out)."""


def offline_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return ``base`` (default: ``os.environ``) with Flower's and Ray's phoning home disabled.

    ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1`` stops a SuperLink from installing the
    app's dependencies (offline that fails the run); telemetry and update checks are off.
    """
    env = dict(os.environ if base is None else base)
    env.update(OFFLINE_ENV)
    return env


def flower_command(name: str) -> str:
    """Return the path of a Flower console script (``flwr``, ``flower-superlink``, ...).

    Raises:
        FlowerRunError: if it is not installed next to this Python nor on ``PATH``.
    """
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if found is None:
        raise FlowerRunError(
            f"Flower's '{name}' command is not installed; pip install \"fedunlearn[flower]\""
        )
    return found


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def toml_table(values: Mapping[str, str | float | int | bool]) -> str:
    """Return flat ``key = value`` TOML lines (strings JSON-quoted, which TOML accepts)."""
    lines = []
    for key, value in values.items():
        if isinstance(value, bool):
            shown = "true" if value else "false"
        elif isinstance(value, int | float):
            shown = repr(value)
        else:
            shown = json.dumps(str(value))
        lines.append(f"{key} = {shown}")
    return "\n".join(lines) + "\n"


def stop_process_group(proc: subprocess.Popen) -> None:
    """Stop a process started with ``start_new_session=True`` and everything in its group."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


@contextmanager
def simulation_superlink(env: dict[str, str], port: int, log_path: Path) -> Iterator[None]:
    """Run a Simulation Runtime SuperLink on ``127.0.0.1:port`` for the block.

    Raises:
        FlowerRunError: if it exits or does not listen within ``START_TIMEOUT_S``.
    """
    command = [
        flower_command("flower-superlink"),
        "--insecure",
        "--simulation",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--disable-runtime-dependency-installation",
    ]
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise FlowerRunError(
                    f"the SuperLink exited with code {proc.returncode}:\n"
                    f"{log_path.read_text()[-3000:]}"
                )
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise FlowerRunError(f"the SuperLink did not listen on {port} in time")
            time.sleep(0.2)
        yield
    finally:
        stop_process_group(proc)


def simulate(
    job: FlowerJob,
    num_supernodes: int,
    *,
    num_cpus: int | None = None,
    client_num_cpus: int = 1,
    client_num_gpus: float = 0.0,
    app_dir: str | Path | None = None,
    timeout: float = 900.0,
) -> dict[str, Any]:
    """Run ``job`` with ``flwr run`` on a local Simulation Runtime and return the run's status.

    Args:
        job: What the ServerApp does (train a run, or unlearn from one).
        num_supernodes: Virtual SuperNodes; node ``i`` hosts client ``i`` (use the run's
            ``data.num_clients``).
        num_cpus: CPUs the Simulation Runtime (Ray) may use (default: all).
        client_num_cpus: CPUs reserved per ClientApp; concurrent clients = num_cpus / this.
        client_num_gpus: Share of a GPU reserved per ClientApp (e.g. 0.25: four per GPU).
        app_dir: The Flower App to run (default: ``bundle.write_app`` into a temporary
            directory).
        timeout: Seconds the whole run may take.

    Returns:
        The run as ``flwr list --format json`` describes it (``status``
        ``finished:completed``, ``run-id``, timings), plus ``log``: what ``flwr run --stream``
        printed (the ServerApp's log).

    Raises:
        FlowerRunError: if the run fails, is stopped or exceeds ``timeout``.
    """
    # here, not at the top: ``python -m fedunlearn.integrations.flower.bundle`` runs that module
    from fedunlearn.integrations.flower.bundle import write_app

    with tempfile.TemporaryDirectory(prefix="fedunlearn-flwr-") as tmp:
        work = Path(tmp)
        env = offline_environment()
        env["FLWR_HOME"] = str(work / "flwr-home")
        port = free_port()
        Path(env["FLWR_HOME"]).mkdir()
        (Path(env["FLWR_HOME"]) / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{port}"\ninsecure = true\n'
        )
        app = Path(app_dir) if app_dir is not None else write_app(work / "app")
        run_config = work / "job.toml"
        run_config.write_text(toml_table(job.to_run_config()))
        federation = {
            "num-supernodes": num_supernodes,
            "client-resources-num-cpus": client_num_cpus,
            "client-resources-num-gpus": float(client_num_gpus),
        }
        if num_cpus is not None:
            federation["init-args-num-cpus"] = num_cpus
        federation_config = " ".join(f"{k}={v}" for k, v in federation.items())
        with simulation_superlink(env, port, work / "superlink.log"):
            started = time.monotonic()
            stream = _flwr(
                env,
                timeout,
                "run",
                str(app),
                CONNECTION,
                "--run-config",
                str(run_config),
                "--federation-config",
                federation_config,
                "--stream",
            )
            found = re.search(r"started run (\d+)", stream)
            if found is None:
                raise FlowerRunError(f"flwr run started no run:\n{stream[-3000:]}")
            remaining = max(30.0, timeout - (time.monotonic() - started))
            listing = _flwr(
                env, remaining, "list", CONNECTION, "--run-id", found.group(1), "--format", "json"
            )
        try:
            (info,) = json.loads(listing[listing.index("{") :])["runs"]
        except (ValueError, KeyError) as err:
            raise FlowerRunError(f"flwr list printed no run ({err}):\n{listing[-2000:]}") from None
        if info.get("status") != "finished:completed":
            raise FlowerRunError(
                f"Flower run {info.get('run-id')} ended {info.get('status')!r}; its log ends:\n"
                f"{stream[-4000:]}"
            )
        return {**info, "log": stream}


def _flwr(env: dict[str, str], timeout: float, *args: str) -> str:
    """Run the ``flwr`` CLI and return its stdout and stderr together."""
    try:
        out = subprocess.run(
            [flower_command("flwr"), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as err:
        tail = (err.stdout or b"")[-3000:]
        shown = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        raise FlowerRunError(
            f"flwr {args[0]} did not finish within {timeout:.0f} s; its output ends:\n{shown}"
        ) from None
    text = out.stdout + out.stderr
    if out.returncode != 0:
        raise FlowerRunError(f"flwr {args[0]} exited with {out.returncode}:\n{text[-3000:]}")
    return text
