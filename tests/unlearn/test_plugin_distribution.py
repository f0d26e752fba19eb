"""A third-party method: one package, one entry-point line, run by name (issue 20).

The test writes a tiny distribution the way pip installs one (a package beside its
``*.dist-info`` with ``entry_points.txt``), puts it on a fresh interpreter's path and runs its
method through ``fedunlearn unlearn``: nothing in fedunlearn names it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

METHOD = '''
"""A third party's method: FedAvg from the final model with the remaining clients, k rounds."""

from dataclasses import dataclass

from pydantic import Field

from fedunlearn.fl.engine import run_rounds
from fedunlearn.unlearn import Details, MethodParams, RunOutput, Unlearner


class TinyParams(MethodParams):
    """Hyperparameters."""

    rounds: int = Field(1, ge=1, le=100)


@dataclass(frozen=True)
class TinyDetails(Details):
    """What it did."""

    rounds: int


class TinyFineTune(Unlearner):
    """Fine-tune the final model on the remaining clients."""

    params_type = TinyParams
    required_policies = None

    def history_bytes_needed(self, context):
        return context.final_params.numel() * 4

    def _run(self, request, context):
        class Count:
            def on_round_end(self, record):
                context.record_round(record)

        params = run_rounds(
            context.clients,
            context.aggregator,
            context.start_from(context.num_rounds),
            num_rounds=self.params.rounds,
            evaluate=context.evaluate,
            observers=[Count()],
        )
        return RunOutput(params, [], TinyDetails(rounds=self.params.rounds))
'''

DECLARATION = """
from fedunlearn.plugins import Plugin

PLUGIN = Plugin(name="tinyforget", methods={"tiny_finetune": "tinyforget.method:TinyFineTune"})
"""


def _install(site: Path) -> None:
    """Lay out ``tinyforget`` 0.1 as an installed distribution under ``site``."""
    package = site / "tinyforget"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""tinyforget: a third-party unlearning method."""\n')
    (package / "method.py").write_text(textwrap.dedent(METHOD))
    (package / "plugin.py").write_text(textwrap.dedent(DECLARATION))
    info = site / "tinyforget-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tinyforget\nVersion: 0.1\n")
    # the one line a method package adds to its pyproject.toml's entry points
    (info / "entry_points.txt").write_text(
        "[fedunlearn.plugins]\ntinyforget = tinyforget.plugin:PLUGIN\n"
    )


def _fedunlearn(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.getcwd()])}
    return subprocess.run(
        [sys.executable, "-m", "fedunlearn.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.slow  # two CLI processes, ~10 s
def test_a_third_party_distribution_method_runs_by_name(tmp_path, run_all):
    # Prepare: the distribution, installed beside (not inside) fedunlearn
    site = tmp_path / "site"
    _install(site)
    # Execute: list the methods, then unlearn client 0 with the plugin's method by name
    listed = _fedunlearn(site, "methods")
    out = tmp_path / "result.json"
    ran = _fedunlearn(
        site,
        "unlearn",
        str(run_all),
        "--method",
        "tiny_finetune",
        "--forget",
        "0",
        "--param",
        "rounds=2",
        "--out",
        str(out),
    )
    # Assert: it is listed beside the built-in ones, ran two rounds and reported them
    assert listed.returncode == 0, listed.stderr
    assert "tiny_finetune" in listed.stdout
    assert "crab" in listed.stdout
    assert ran.returncode == 0, ran.stderr
    result = json.loads(out.read_text())
    assert result["method"] == "tiny_finetune"
    assert result["details"] == {"rounds": 2}
    assert result["costs"]["client_epochs"] > 0


@pytest.mark.slow
def test_without_the_distribution_the_name_is_unknown(tmp_path, run_all):
    out = tmp_path / "result.json"
    ran = _fedunlearn(
        tmp_path,
        "unlearn",
        str(run_all),
        "--method",
        "tiny_finetune",
        "--forget",
        "0",
        "--out",
        str(out),
    )
    assert ran.returncode != 0
    assert "unknown unlearning method 'tiny_finetune'; available: crab" in ran.stderr
    assert not out.exists()
