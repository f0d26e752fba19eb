import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from typer.testing import CliRunner

from fedunlearn.cli.main import app
from fedunlearn.history.store import HistoryStore

runner = CliRunner()

CONFIG = {
    "seed": 4,
    "data": {"dataset": "digits", "num_clients": 5},
    "model": {"name": "mlp", "hidden": [32]},
    "training": {"rounds": 4, "local_epochs": 2, "lr": 0.3, "batch_size": 32, "executor": "serial"},
    "history": {"policy": "all"},
}


def write_config(path, cfg=CONFIG):
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
def test_train_then_info_json(tmp_path):
    cfg = write_config(tmp_path / "c.yaml")
    res = runner.invoke(app, ["train", str(cfg), "--out", str(tmp_path / "run"), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["rounds"] == 4
    assert summary["final_metrics"]["test_accuracy"] > 0.5
    res = runner.invoke(app, ["info", str(tmp_path / "run"), "--json"])
    info = json.loads(res.stdout)
    assert info["rounds_completed"] == 4
    assert info["stored_bytes"] > 0
    res = runner.invoke(app, ["info", str(tmp_path / "run")])
    assert res.exit_code == 0
    assert "stored bytes" in res.stdout


def test_bad_config_exits_2_with_the_field_named(tmp_path):
    bad = {**CONFIG, "training": {**CONFIG["training"], "batch_size": 0}}
    cfg = write_config(tmp_path / "c.yaml", bad)
    res = runner.invoke(app, ["train", str(cfg), "--out", str(tmp_path / "run")])
    assert res.exit_code == 2
    assert "training.batch_size" in res.output
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_seed_override_changes_the_run(tmp_path):
    cfg = write_config(tmp_path / "c.yaml")
    runner.invoke(app, ["train", str(cfg), "--out", str(tmp_path / "a"), "--json"])
    runner.invoke(app, ["train", str(cfg), "--out", str(tmp_path / "b"), "--json", "--seed", "9"])
    with (
        HistoryStore.open(tmp_path / "a" / "history") as a,
        HistoryStore.open(tmp_path / "b" / "history") as b,
    ):
        assert not torch.equal(a.read_model(4), b.read_model(4))


@pytest.mark.slow
def test_kill_9_mid_training_then_resume_gives_the_uninterrupted_model(tmp_path):
    """A real `fedunlearn train` process is SIGKILLed mid-run, then resumed."""
    cfg_dict = {**CONFIG, "training": {**CONFIG["training"], "rounds": 20}}
    cfg = write_config(tmp_path / "c.yaml", cfg_dict)
    ref = runner.invoke(app, ["train", str(cfg), "--out", str(tmp_path / "ref"), "--json"])
    assert ref.exit_code == 0, ref.output
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "fedunlearn.cli.main", "train", str(cfg), "--out", str(out)]
    # same intra-op thread count as this process (conftest: 1): float reductions depend on it
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 120
    metrics = out / "metrics.jsonl"
    while time.monotonic() < deadline:  # wait until a few rounds are committed
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 5:
            break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with HistoryStore.open(out / "history") as store:
        done = store.last_round()
    assert done is not None, f"process finished {done} rounds before kill"
    assert 5 <= done < 20, f"process finished {done} rounds before kill"
    res = runner.invoke(app, ["train", str(cfg), "--out", str(out), "--resume", "--json"])
    assert res.exit_code == 0, res.output
    with (
        HistoryStore.open(tmp_path / "ref" / "history") as a,
        HistoryStore.open(out / "history") as b,
    ):
        a.verify()
        b.verify()
        assert torch.equal(a.read_model(20), b.read_model(20))
        assert b.rounds() == list(range(21))
