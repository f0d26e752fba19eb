"""Review of issue 22: no apply file keeps a later-forgotten client's updates (apply consumes it).

``R.apply.safetensors`` holds the method's whole trajectory: every remaining client's update
of every round (docs/lifecycle.md, "Apply"). Once applied, the same updates live in the store,
where a later ``forget`` erases them with a deletion record and a page scan. The apply file
is left beside ``R.json``: when a later request forgets one of those remaining clients (its
result applied, ``forget`` run, the store check passing), the earlier apply file still holds
that client's updates round by round. Fixed: apply deletes the file once the store holds it.
"""

import json

import pytest

from fedunlearn.config import parse_config
from fedunlearn.experiments import save_for_apply, unlearn_one
from fedunlearn.experiments.lifecycle import apply_file_path
from fedunlearn.history.result_file import read_result_file
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import apply_result, forget_clients, train_run

SMALL = {
    "seed": 1,
    "data": {"dataset": "digits", "num_clients": 4, "max_train_samples": 400},
    "model": {"name": "mlp", "hidden": [8]},
    "training": {"rounds": 2, "local_epochs": 1, "lr": 0.3, "batch_size": 32, "executor": "serial"},
    "history": {"policy": "all"},
}


def _request(run, forget, out):
    result, summary = unlearn_one(run, forget, "retrain", verify=False)
    save_for_apply(out, summary, result)
    out.write_text(json.dumps(summary))
    apply_result(run, out)


@pytest.mark.slow
def test_no_apply_file_keeps_a_later_forgotten_clients_updates(tmp_path):
    run = tmp_path / "run"
    train_run(parse_config(SMALL), run)

    _request(run, [0], tmp_path / "r0.json")  # request 1; client 2 remains
    _request(run, [2], tmp_path / "r2.json")  # request 2 forgets client 2 (and 0)
    forget_clients(run, [2])
    with HistoryStore.open(run / "history") as store:
        assert store.check_deletions([2]).ok  # the store says client 2 is gone

    kept = []
    for out in ("r0.json", "r2.json"):
        file = apply_file_path(tmp_path / out)
        if file.exists():
            trajectory = read_result_file(file).trajectory
            kept += [(out, e.round) for e in trajectory.rounds if 2 in e.updates]
    assert kept == []
    assert not apply_file_path(tmp_path / "r0.json").exists()


@pytest.mark.slow
def test_apply_consumes_its_file_and_a_rerun_says_it_was_applied(tmp_path):
    run = tmp_path / "run"
    train_run(parse_config(SMALL), run)
    out = tmp_path / "r0.json"
    result, summary = unlearn_one(run, [0], "retrain", verify=False)
    save_for_apply(out, summary, result)
    out.write_text(json.dumps(summary))
    first = apply_result(run, out)
    assert not first["already_applied"]
    assert not apply_file_path(out).exists()
    again = apply_result(run, out)  # e.g. the same command run twice: nothing happens
    assert again["already_applied"]
    assert again["generation"] == first["generation"]
