"""Thread counts (issue 35, item 4): chosen for the CPUs a process gets, kept per run.

- ``--threads N`` sets the count a new run trains with; the run records it and says so.
- Without it the count is torch's default capped at the CPUs the process may use (affinity,
  cgroup quota): parsed here from files shaped like ``cpu.max`` and ``cpu.cfs_quota_us``.
- An unlearning session (so a receipt and an auditor's replay) computes at the run's own count
  whatever the process's default: float reductions differ between counts.
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from fedunlearn.cli.main import app
from fedunlearn.cli.threads import cgroup_cpu_limit, choose_threads
from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnSession

runner = CliRunner()

RUN = {
    "seed": 3,
    "data": {"dataset": "digits", "num_clients": 4},
    "model": {"name": "logreg"},
    "training": {"rounds": 2, "local_epochs": 1, "lr": 0.3, "batch_size": 64, "executor": "serial"},
    "history": {"policy": "all"},
}


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [("150000 100000\n", 2), ("100000 100000\n", 1), ("50000 100000\n", 1), ("max 100000\n", None)],
)
def test_a_cgroup_v2_quota_caps_the_cpus(tmp_path, cpu_max, expected):
    path = tmp_path / "cpu.max"
    path.write_text(cpu_max)
    missing = tmp_path / "absent"
    assert cgroup_cpu_limit(path, missing, missing) == expected


def test_a_cgroup_v1_quota_caps_the_cpus(tmp_path):
    quota, period, missing = tmp_path / "q", tmp_path / "p", tmp_path / "absent"
    quota.write_text("400000\n")
    period.write_text("100000\n")
    assert cgroup_cpu_limit(missing, quota, period) == 4
    quota.write_text("-1\n")  # no quota
    assert cgroup_cpu_limit(missing, quota, period) is None
    assert cgroup_cpu_limit(missing, missing, missing) is None


def test_the_choice_caps_the_default_and_honours_a_request():
    assert choose_threads(None, torch_default=32, cpus=2).threads == 2  # a container's quota
    assert choose_threads(None, torch_default=2, cpus=8).threads == 2  # torch's default kept
    assert choose_threads(3, torch_default=2, cpus=2).threads == 3
    with pytest.raises(ConfigError):
        choose_threads(0, torch_default=2, cpus=2)


@pytest.mark.slow
def test_a_run_trained_with_threads_1_records_and_states_it(tmp_path, restore_threads):
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps(RUN))
    res = runner.invoke(app, ["--threads", "1", "train", str(config), "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    row = next(line for line in res.output.splitlines() if "torch threads" in line)
    assert "1 (--threads" in row
    with HistoryStore.open(tmp_path / "r" / "history") as store:
        assert store.meta["torch_threads"] == 1
    assert torch.get_num_threads() == restore_threads  # the process's count is given back


def test_threads_out_of_range_exit_2(tmp_path):
    res = runner.invoke(app, ["--threads", "0", "info", str(tmp_path)])
    assert res.exit_code == 2


def test_an_unlearning_session_computes_at_the_runs_own_count(tmp_path, restore_threads):
    # before: a session used the process's count, so a receipt or an auditor's replay on a
    # machine with another default computed with other float reductions than the run's
    torch.set_num_threads(1)
    train_run(parse_config(RUN), tmp_path / "run")  # recorded: 1
    torch.set_num_threads(2)  # an auditor's machine with more threads
    with pytest.warns(UserWarning, match="runs with 1 to stay bit-identical"):
        session = UnlearnSession(tmp_path / "run", evaluate=False)
    with session:
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
