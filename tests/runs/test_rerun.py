"""Issue 37: every lifecycle command is safe to re-run (docs/faults.md, "Re-running").

Before: ``train --continue RUN --rounds N`` re-run after the first had committed its last round
trained N more rounds (the docs gave "re-run the same command" as the recovery), and an
``apply`` stopped by a full disk while rewriting ``metrics.jsonl`` left its apply file behind
when re-run (a copy of every remaining client's updates).
"""

import json
import shutil

import pytest
import torch
from tests.support.faults import Fault, error_lines, run, small_config

from fedunlearn.config import parse_config
from fedunlearn.experiments.lifecycle import apply_file_path
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import train_run

pytestmark = pytest.mark.slow  # real processes on a trained run (10-30 s each on 2 cores)

SMALL = small_config(3)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("rerun") / "run"
    train_run(parse_config(SMALL), run_dir)
    return run_dir


def models(run_dir):
    with HistoryStore.open(run_dir / "history") as store:
        return [store.read_model(r) for r in store.rounds()]


def test_continue_to_round_rerun_after_a_kill_at_its_last_round_does_nothing(trained, tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    shutil.copytree(trained, whole)
    shutil.copytree(trained, cut)
    assert run(["train", "--continue", whole, "--to-round", 5]).returncode == 0
    # killed after round 5 was committed, before summary.json was rewritten
    killed = run(
        ["train", "--continue", cut, "--to-round", 5],
        faults=[Fault("fedunlearn.runs.run_files:_rewrite_summary", "kill")],
    )
    assert killed.returncode == -9

    again = run(["train", "--continue", cut, "--to-round", 5])
    twice = run(["train", "--continue", cut, "--to-round", 5, "--json"])

    assert again.returncode == 0
    assert "nothing to do" in again.stdout
    assert json.loads(twice.stdout)["already_done"] is True
    assert len(models(cut)) == 6  # rounds 0..5: no round was added
    assert all(torch.equal(a, b) for a, b in zip(models(whole), models(cut), strict=True))
    summary = json.loads((cut / "summary.json").read_text())
    assert summary["rounds"] == 5  # the file the kill left stale is rewritten
    assert (cut / "metrics.jsonl").read_text() == (whole / "metrics.jsonl").read_text()
    behind = run(["train", "--continue", cut, "--to-round", 4])
    assert behind.returncode == 2
    assert "past --to-round 4" in error_lines(behind)[0]


def test_rounds_rerun_while_unfinished_resumes_and_to_round_names_the_same_target(
    trained, tmp_path
):
    cut = tmp_path / "cut"
    shutil.copytree(trained, cut)
    killed = run(
        ["train", "--continue", cut, "--rounds", 3],
        faults=[Fault("fedunlearn.history.store.sqlite:HistoryStore.write_round", "kill")],
    )
    assert killed.returncode == -9  # before round 4 was committed; the target 6 was
    other = run(["train", "--continue", cut, "--to-round", 7])
    same = run(["train", "--continue", cut, "--to-round", 6, "--json"])

    assert other.returncode == 2
    assert "--to-round 6" in error_lines(other)[0]
    done = json.loads(same.stdout)
    assert same.returncode == 0
    assert done["target"] == 6
    assert done["resumed_from_round"] == 3


def test_apply_stopped_by_a_full_disk_at_metrics_jsonl_finishes_on_rerun(trained, tmp_path):
    work = tmp_path / "run"
    shutil.copytree(trained, work)
    result = tmp_path / "r.json"
    made = run(["unlearn", work, "--forget", "1", "--method", "retrain", "--out", result,
                "--no-client-test"])  # fmt: skip
    assert made.returncode == 0, made.stderr
    metrics_before = (work / "metrics.jsonl").read_text()

    full = run(
        ["apply", work, "--result", result],
        faults=[Fault("fedunlearn.runs.run_files:write_text_atomic", "enospc")],
    )

    assert full.returncode == 2
    assert len(error_lines(full)) == 1
    assert "generation 1 was applied" in error_lines(full)[0]
    assert (work / "metrics.jsonl").read_text() == metrics_before  # left whole
    with HistoryStore.open(work / "history") as store:
        assert store.generation() == 1  # the store is committed
    again = run(["apply", work, "--result", result])
    assert again.returncode == 0
    assert "applied before" in again.stdout
    assert not apply_file_path(result).exists()  # consumed on the re-run too
    verified = run(["verify", work])
    assert verified.returncode == 0, verified.stderr
