"""Review of issue 22: summary.json after apply and --continue; a non-finite model is not applied.

``summary.json`` is the run directory's one-file answer to "what is this run now" (README,
docs/architecture.md). Before the fix ``apply`` and ``train --continue`` left it as training
wrote it: the original model's metrics (the model a deletion request replaced) and the trained
round count, so a reader of the run saw a model the run no longer serves.
"""

import json

import pytest

from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import SUMMARY_FILE, apply_model, continue_run, train_run

SMALL = {
    "seed": 1,
    "data": {"dataset": "digits", "num_clients": 4, "max_train_samples": 400},
    "model": {"name": "mlp", "hidden": [8]},
    "training": {"rounds": 2, "local_epochs": 1, "lr": 0.3, "batch_size": 32, "executor": "serial"},
    "history": {"policy": "all"},
}


@pytest.mark.slow
def test_summary_follows_apply_and_continue(tmp_path):
    run = tmp_path / "run"
    train_run(parse_config(SMALL), run)
    with HistoryStore.open(run / "history") as store:
        outside = store.read_model(0).clone()  # the initial model: clearly another model

    trained = json.loads((run / SUMMARY_FILE).read_text())
    apply_model(run, outside, [1])
    after_apply = json.loads((run / SUMMARY_FILE).read_text())
    continue_run(run, 2)
    after_continue = json.loads((run / SUMMARY_FILE).read_text())

    with HistoryStore.open(run / "history") as store:
        applied = store.round_scalars(3)
        last = store.round_scalars(5)
        stored = store.stored_bytes()
    assert after_apply["rounds"] == 3
    assert after_apply["generation"] == 1
    assert after_apply["forgotten_clients"] == [1]
    # a model applied from outside has no measured metrics: none, not the trained model's
    assert "test_accuracy" in trained["final_metrics"]
    measured = {k: v for k, v in applied.items() if k != "applied_event"}
    assert after_apply["final_metrics"] == measured
    assert "test_accuracy" not in after_apply["final_metrics"]
    assert after_continue["rounds"] == 5
    assert after_continue["final_metrics"]["test_accuracy"] == last["test_accuracy"]
    assert after_continue["stored_bytes"] == stored


@pytest.mark.slow
def test_a_model_with_nan_is_not_applied(tmp_path):
    """Review: 'apply --model' accepted a NaN model; the run served it and continued from it."""
    run = tmp_path / "run"
    train_run(parse_config(SMALL), run)
    with HistoryStore.open(run / "history") as store:
        model = store.read_model(2).clone()
    model[3] = float("nan")

    with pytest.raises(ConfigError, match="1 NaN or infinite value") as err:
        apply_model(run, model, [1])

    assert "nothing was changed" in str(err.value)
    with HistoryStore.open(run / "history") as store:
        assert store.generation() == 0
        assert store.last_round() == 2
