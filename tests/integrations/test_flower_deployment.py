"""Flower Deployment Engine: the example app on a SuperLink and two SuperNodes (real processes).

Insecure mode (no TLS) on free ports; every process is started in its own session and its
whole process group is killed in the fixture's finaliser, whatever happens.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip(
    "flwr", reason='Flower is not installed; pip install -e ".[flower]" to run these tests'
)

import torch  # noqa: E402
from flower_support import assert_same_history, small_config, write_config  # noqa: E402

from fedunlearn import train_run  # noqa: E402
from fedunlearn.integrations.flower.simulation import offline_environment  # noqa: E402
from fedunlearn.models import get_flat_params, load_model  # noqa: E402
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method  # noqa: E402

pytestmark = pytest.mark.slow

START_TIMEOUT_S = 60
RUN_TIMEOUT_S = 300
EXAMPLE_APP = Path(__file__).resolve().parents[2] / "examples" / "flower-app"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"SuperLink exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    pytest.fail(f"SuperLink did not listen on {port} within {START_TIMEOUT_S} s")


@dataclass
class Deployment:
    env: dict[str, str]
    app_dir: Path
    logs: Path

    def flwr(self, *args: str, timeout: float = 120) -> dict:
        out = subprocess.run(
            ["flwr", *args, "--format", "json"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        start = out.stdout.find("{")
        if start < 0:
            pytest.fail(f"flwr {' '.join(args)} printed no JSON:\n{out.stdout}\n{out.stderr}")
        return json.loads(out.stdout[start:])

    def run(self, run_config: str) -> dict:
        """Submit the app, wait until the run finishes, and return its final status.

        ``flwr run --stream`` waits for the run's end in one process; starting a ``flwr list``
        process every second instead took CPU from the run on a 2-core machine. The status is
        read with ``flwr list`` (polled, should the stream end before the run).
        """
        streamed = subprocess.run(
            ["flwr", "run", str(self.app_dir), "local", "--run-config", run_config, "--stream"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        text = streamed.stdout + streamed.stderr
        found = re.search(r"started run (\d+)", text)
        if streamed.returncode != 0 or found is None:
            pytest.fail(f"flwr run exited {streamed.returncode}, started no run:\n{text[-3000:]}")
        run_id = found.group(1)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline:
            (info,) = self.flwr("list", "local", "--run-id", run_id)["runs"]
            # "finished:completed", ":failed" or ":stopped"; flwr run exits 0 on a failed run
            if info["status"].startswith("finished"):
                return info
            time.sleep(1.0)
        pytest.fail(f"run {run_id} did not finish in {RUN_TIMEOUT_S} s; logs in {self.logs}")


@pytest.fixture
def deployment(tmp_path, flower_lock):
    env = offline_environment()
    env["FLWR_HOME"] = str(tmp_path / "flwr_home")
    port = free_port()
    Path(env["FLWR_HOME"]).mkdir()
    (Path(env["FLWR_HOME"]) / "config.toml").write_text(
        f'[superlink]\ndefault = "local"\n\n[superlink.local]\n'
        f'address = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: list[subprocess.Popen] = []

    def start(name: str, args: list[str]) -> subprocess.Popen:
        with (logs / f"{name}.log").open("w") as log:
            proc = subprocess.Popen(
                args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        procs.append(proc)
        return proc

    try:
        link = start(
            "superlink",
            [
                "flower-superlink",
                "--insecure",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--disable-runtime-dependency-installation",
            ],
        )
        wait_for_port(port, link, logs / "superlink.log")
        for client in (0, 1):
            start(
                f"supernode{client}",
                [
                    "flower-supernode",
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{port}",
                    "--port",
                    str(free_port()),
                    "--node-config",
                    f"partition-id={client} num-partitions=2",
                ],
            )
        yield Deployment(env, EXAMPLE_APP, logs)
    finally:
        for proc in procs:  # SuperNodes first would not matter: each group goes down whole
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=5)
                    break
                except subprocess.TimeoutExpired:
                    continue
        for proc in procs:  # children left in the group (ServerApp, ClientApp processes)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_deployed_training_and_unlearning_equal_in_process(tmp_path, deployment):
    # Prepare
    config = small_config(num_clients=2, rounds=2)
    path = write_config(config, tmp_path / "config.yaml")
    train_run(config, tmp_path / "inproc")
    run_dir = tmp_path / "flower"

    # Execute
    info = deployment.run(
        f'mode="train" run-dir="{run_dir}" config-path="{path}" '
        "round-timeout=240.0 node-timeout=60.0"
    )

    # Assert
    assert info["status"] == "finished:completed", (info, deployment.logs)
    assert_same_history(tmp_path / "inproc", run_dir, rounds=2)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["missing"] == {}

    # Execute: a later request to forget client 1; calibration goes to client 0's node only
    out = tmp_path / "forget1.json"
    info = deployment.run(
        f'mode="unlearn" run-dir="{run_dir}" method="federaser" forget="1" '
        f'method-params=\'{{"calibration_ratio": 1.0}}\' result-path="{out}"'
    )

    # Assert: the in-process method on the same history gives the same model and costs
    assert info["status"] == "finished:completed", (info, deployment.logs)
    with UnlearnSession(run_dir) as session:
        want = session.run(
            make_method("federaser", {"calibration_ratio": 1.0}), UnlearnRequest.of([1])
        )
    got = get_flat_params(load_model(out.with_suffix(".safetensors")))
    torch.testing.assert_close(got, want.params, atol=1e-6, rtol=0)
    result = json.loads(out.read_text())
    assert result["costs"]["client_participations"] == want.costs.client_participations == 1
