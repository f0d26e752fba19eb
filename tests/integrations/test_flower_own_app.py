"""examples/flower-own-app from its README's commands: ``flwr run`` on the Simulation Runtime.

Slow (two Flower runs, each starting Ray): the user's own ServerApp (FedAvg in ``Recording``)
trains 3 nodes whose data never leaves them, ``fedunlearn info``/``verify`` read the run,
``fedunlearn unlearn`` queues a request, and the app's next ``flwr run`` serves it (Retrain):
client 1 forgotten with fresh training on the other two nodes and its losses computed on its
own node.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "flwr", reason='Flower is not installed; pip install -e ".[flower]" to run these tests'
)
pytest.importorskip("sklearn", reason="the example's nodes load scikit-learn's digits")

from flower_support import flower_environment  # noqa: E402

from fedunlearn.integrations.flower.simulation import (  # noqa: E402
    flower_command,
    simulation_superlink,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flower-own-app"
README = EXAMPLE / "README.md"


def readme_commands() -> list[str]:
    """The ``flwr run`` / ``fedunlearn`` lines of the README's bash blocks, continuations joined."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [
        " ".join(x.split("#")[0].split()) for x in lines if x.startswith(("flwr ", "fedunlearn "))
    ]


def run(command: str, env: dict[str, str], run_dir: Path) -> str:
    command = command.replace("/abs/runs/own", str(run_dir))
    binary, *rest = command.split(" ", 1)
    path = flower_command("flwr") if binary == "flwr" else str(Path(sys.executable).parent / binary)
    out = subprocess.run(
        f"{path} {rest[0] if rest else ''}",
        shell=True,
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, f"{command} exited {out.returncode}:\n{text[-3000:]}"
    return text


@pytest.mark.slow
def test_readme_trains_records_and_unlearns_over_flwr_run(tmp_path, flower_lock):
    commands = readme_commands()
    assert [c.split()[:2] for c in commands] == [
        ["flwr", "run"],
        ["fedunlearn", "info"],
        ["fedunlearn", "verify"],
        ["fedunlearn", "unlearn"],
        ["flwr", "run"],
    ]
    env, port = flower_environment(tmp_path)
    run_dir = tmp_path / "run"
    with simulation_superlink(env, port, tmp_path / "superlink.log"):
        log = run(commands[0], env, run_dir)  # train, recorded
        assert (run_dir / "summary.json").exists(), log[-4000:]
        info = json.loads(run(commands[1] + " --json", env, run_dir))
        assert info["dataset"] == "node-local", info
        assert info["complete"], info
        assert info["num_clients"] == 3
        assert info["rounds_completed"] == 3
        assert info["model"] == "own_app.task:Net"
        run(commands[2], env, run_dir)
        queued = run(commands[3], env, run_dir)  # fedunlearn unlearn: queued for the app
        assert "flwr run ." in queued
        log = run(commands[4], env, run_dir)  # the same flwr run serves it
        assert (run_dir / "forget1.json").exists(), log[-4000:]
    assert "Traceback" not in log, log[-4000:]
    assert "result written to" in log, log[-4000:]
    result = json.loads((run_dir / "forget1.json").read_text())
    assert result["request"]["forget"] == [1]
    assert result["missing"] == {}
    check = result["client_check"]["1"]
    assert check["shown"], check
    assert check["samples"] > 0, check
    assert result["costs"]["client_participations"] > 0  # fresh training on the remaining nodes
    sys.path.insert(0, str(EXAMPLE))
    try:
        from own_app.task import Net

        from fedunlearn.models import load_model

        assert isinstance(load_model(run_dir / "forget1.safetensors", factory=Net), Net)
    finally:
        sys.path.remove(str(EXAMPLE))
