"""examples/own-model: the README's commands, run as real CLI processes in a copy of the example."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own-model"


def readme_commands() -> str:
    """Return the README's ``bash`` block under '## Run it'."""
    text = (EXAMPLE / "README.md").read_text()
    section = text.split("## Run it", 1)[1]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    assert match, "examples/own-model/README.md lost its bash block"
    return match.group(1)


@pytest.mark.slow
def test_the_readme_commands_train_unlearn_audit_and_export_a_users_own_model(tmp_path):
    # Prepare: a copy of the example without generated files; the test's interpreter first
    work = tmp_path / "own-model"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("data", "runs", "__pycache__"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)

    # Execute
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", readme_commands()],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )

    # Assert
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((work / "runs" / "fedrecover.json").read_text())
    assert result["method"] == "fedrecover"
    assert (work / "runs" / "final.safetensors").stat().st_size > 0
    assert "SmallBNNet" in done.stdout
    assert "BatchNorm2d" in done.stdout
    assert "changed since training" not in done.stderr
