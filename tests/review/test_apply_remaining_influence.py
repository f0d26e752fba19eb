"""Review of issue 22: applying a result that removed nobody's influence.

``apply`` records its forget set as removed: the clients leave the federation, every later
request counts them as ``earlier`` and a new request naming them stops with "nothing new to
forget". Before the fix the no-unlearning control (``none``: the run's model unchanged) and a
result whose own receipt says the influence REMAINS were applied like any other, so a deletion
request was recorded as served while the client's influence stayed in the served model, and it
could not be requested again. Also: apply now returns (and the CLI prints) what the receipt flagged.
"""

import json
import shutil

import pytest

from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError
from fedunlearn.experiments import save_for_apply, unlearn_one
from fedunlearn.history.digest import seal
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import apply_result, train_run

SMALL = {
    "seed": 1,
    "data": {"dataset": "digits", "num_clients": 4, "max_train_samples": 400},
    "model": {"name": "mlp", "hidden": [8]},
    "training": {"rounds": 2, "local_epochs": 1, "lr": 0.3, "batch_size": 32, "executor": "serial"},
    "history": {"policy": "all"},
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("remaining") / "run"
    train_run(parse_config(SMALL), run)
    return run


def _result(run, method, out, verify=False):
    result, summary = unlearn_one(run, [1], method, verify=verify)
    save_for_apply(out, summary, result)
    out.write_text(json.dumps(summary))
    return summary


def _unchanged(run):
    with HistoryStore.open(run / "history") as store:
        return store.generation() == 0 and store.last_round() == 2


@pytest.mark.slow
def test_the_no_unlearning_control_is_not_applied(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    _result(run, "none", tmp_path / "none.json")

    with pytest.raises(ConfigError, match="removes no client") as err:
        apply_result(run, tmp_path / "none.json")

    assert "\n" not in str(err.value)
    assert "nothing was changed" in str(err.value)
    assert _unchanged(run)


@pytest.mark.slow
def test_a_result_whose_receipt_says_the_influence_remains_is_not_applied(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    summary = _result(run, "random", tmp_path / "r.json")
    # the receipt as 'fedunlearn unlearn' writes it when a check shows the influence remains
    summary["verification"] = {"influence": "remains", "verdict": "fail", "checks": []}
    seal(summary, summary["run"])  # as written by unlearn (a receipt it did not compute)
    (tmp_path / "r.json").write_text(json.dumps(summary))

    with pytest.raises(ConfigError, match="influence remains") as err:
        apply_result(run, tmp_path / "r.json")

    assert "--model" in str(err.value)  # the way to apply it anyway, knowingly
    assert _unchanged(run)


@pytest.mark.slow
def test_apply_says_what_the_results_receipt_warned_about(trained, tmp_path):
    """Review: apply printed the event only; a receipt's warnings went unseen at apply time."""
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    summary = _result(run, "retrain", tmp_path / "r.json")
    summary["verification"] = {
        "influence": "removed",
        "checks": [
            {"name": "backdoor", "verdict": "pass", "reason": "removed"},
            {"name": "utility", "verdict": "warn", "reason": "accuracy 9 points below"},
        ],
    }
    seal(summary, summary["run"])  # as written by unlearn (a receipt it did not compute)
    (tmp_path / "r.json").write_text(json.dumps(summary))

    event = apply_result(run, tmp_path / "r.json")

    assert event["receipt"] == {
        "influence": "removed",
        "flagged": [{"check": "utility", "verdict": "warn", "reason": "accuracy 9 points below"}],
    }
    assert apply_result(run, tmp_path / "r.json")["receipt"] == event["receipt"]  # a re-run


@pytest.mark.slow
def test_the_note_leaves_out_the_store_check_that_apply_made_stale(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    summary = _result(run, "retrain", tmp_path / "r.json")
    summary["verification"] = {
        "influence": "removed",
        "checks": [
            {"name": "deletion", "verdict": "warn", "reason": "still stored", "scope": "store"}
        ],
    }
    seal(summary, summary["run"])  # as written by unlearn (a receipt it did not compute)
    (tmp_path / "r.json").write_text(json.dumps(summary))

    assert apply_result(run, tmp_path / "r.json")["receipt"]["flagged"] == []
