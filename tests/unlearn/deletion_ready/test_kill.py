"""kill -9 inside a deletion-ready recomputation, and inside its apply: the rerun is bit-identical.

``fedunlearn unlearn`` reads the run and writes its result at the end (the store is opened
read-only), so a process killed in the middle of the replay leaves nothing behind and the same
command gives the uninterrupted result, model and trajectory bit for bit. ``apply`` commits in
one transaction; killed inside it, the same command finishes to the uninterrupted store.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from fedunlearn.config import parse_config
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import train_run

pytestmark = pytest.mark.slow

CONFIG = {
    "seed": 1,
    "data": {"dataset": "digits", "num_clients": 12},
    "model": {"name": "logreg"},
    "training": {
        "rounds": 10,
        "lr": 0.3,
        "batch_size": 4,
        "participation": 0.25,
        "sampling": "tv_stable",
        "local_steps": 2,
        "executor": "serial",
    },
    "history": {"policy": "all"},
}

_KILLED = """
import os, signal, sys
import fedunlearn.unlearn.exact as exact
rounds = []
run_round = exact.run_round
def train_then_die(*args, **kwargs):
    rounds.append(1)
    if len(rounds) == 3:  # inside the replay: two rounds recomputed, the third started
        os.kill(os.getpid(), signal.SIGKILL)
    return run_round(*args, **kwargs)
exact.run_round = train_then_die
if sys.argv[1] == "apply":
    from fedunlearn.history.store.events import Generations
    inserted = Generations._insert_round
    def insert_then_die(self, entry, now):
        inserted(self, entry, now)
        os.kill(os.getpid(), signal.SIGKILL)  # inside the apply's one transaction
    Generations._insert_round = insert_then_die
from fedunlearn.cli.main import main
sys.argv = ["fedunlearn", *sys.argv[1:]]
main()
"""


def _cli(*args, killed=False):
    cmd = (
        [sys.executable, "-c", _KILLED] if killed else [sys.executable, "-m", "fedunlearn.cli.main"]
    )
    return subprocess.run([*cmd, *map(str, args)], capture_output=True, text=True, check=False)


def test_killed_replay_and_apply_rerun_to_the_uninterrupted_result(tmp_path):
    run = tmp_path / "run"
    train_run(parse_config(CONFIG), run)
    with HistoryStore.open(run / "history") as store:
        first = {
            c: min(
                (t for t in range(1, 11) if any(r.client_id == c for r in store.client_records(t))),
                default=99,
            )
            for c in range(12)
        }
    client = min((c for c in first if first[c] <= 6), key=lambda c: first[c])
    twin = tmp_path / "twin"
    shutil.copytree(run, twin)
    request = ["--forget", client, "--method", "tv_exact", "--no-client-test"]

    uninterrupted = _cli("unlearn", twin, *request, "--out", tmp_path / "full.json")
    assert uninterrupted.returncode == 0, uninterrupted.stderr
    killed = _cli("unlearn", run, *request, "--out", tmp_path / "cut.json", killed=True)
    assert killed.returncode == -signal.SIGKILL
    assert not (tmp_path / "cut.json").exists()
    assert not (tmp_path / "cut.apply.safetensors").exists()
    rerun = _cli("unlearn", run, *request, "--out", tmp_path / "cut.json")
    assert rerun.returncode == 0, rerun.stderr
    full = json.loads((tmp_path / "full.json").read_text())
    cut = json.loads((tmp_path / "cut.json").read_text())
    assert cut["apply"]["model_sha256"] == full["apply"]["model_sha256"]
    assert cut["details"]["recomputed_from_round"] == first[client]

    assert _cli("apply", twin, "--result", tmp_path / "full.json").returncode == 0
    died = _cli("apply", run, "--result", tmp_path / "cut.json", killed=True)
    assert died.returncode == -signal.SIGKILL
    with HistoryStore.open(run / "history") as store:
        assert store.generation() == 0  # the transaction rolled back: nothing changed
    again = _cli("apply", run, "--result", tmp_path / "cut.json")
    assert again.returncode == 0, again.stderr
    with HistoryStore.open(run / "history") as a, HistoryStore.open(twin / "history") as b:
        assert a.rounds() == b.rounds()
        for r in a.rounds():
            assert torch.equal(a.read_model(r), b.read_model(r))
            assert dict(a.iter_updates(r)).keys() == dict(b.iter_updates(r)).keys()
        assert a.generation() == b.generation() == 1
