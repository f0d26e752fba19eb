"""Review of issue 22: a later receipt must not say an earlier client was removed "by construction".

``eval/generations.py``: an earlier client's entry is ``removed`` only when the result was
trained afresh from M_0 with an exact lineage (Retrain); otherwise ``not_shown``. The test for
"afresh from M_0" was "read at most one model's bytes", which any method that read one other
model passes. The no-unlearning control reads the current model (M_T, the applied result):
on a request whose new client was never aggregated its lineage is exact, so the receipt said
the earlier client was "removed by construction: ... never aggregated" although it was
aggregated in the original run and removed only by the earlier (applied) result.
"""

import json

import pytest

from fedunlearn.config import parse_config
from fedunlearn.experiments import save_for_apply, unlearn_one
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import apply_result, train_run

SMALL = {
    "seed": 1,
    "data": {"dataset": "digits", "num_clients": 4, "max_train_samples": 400},
    "model": {"name": "mlp", "hidden": [8]},
    "training": {
        "rounds": 2,
        "local_epochs": 1,
        "lr": 0.3,
        "batch_size": 32,
        "executor": "serial",
        "participation": 0.25,  # one client a round: two clients are never aggregated
    },
    "history": {"policy": "all"},
}


@pytest.mark.slow
def test_the_control_on_a_later_request_does_not_claim_an_earlier_client_removed(tmp_path):
    run = tmp_path / "run"
    train_run(parse_config(SMALL), run)
    with HistoryStore.open(run / "history") as store:
        seen = {c.client_id for t in store.rounds() if t for c in store.client_records(t)}
    earlier, never = min(seen), min(set(range(4)) - seen)
    result, summary = unlearn_one(run, [earlier], "retrain", verify=False)
    save_for_apply(tmp_path / "r.json", summary, result)
    (tmp_path / "r.json").write_text(json.dumps(summary))
    apply_result(run, tmp_path / "r.json")

    _, second = unlearn_one(run, [never], "none", verify=True)

    entries = {e["client"]: e for e in second["verification"]["clients"]}
    assert second["request"]["earlier"] == [earlier]
    assert second["lineage"]["start_round"] != 0  # the control read the current model
    assert entries[earlier]["request"] == "earlier"
    assert entries[earlier]["influence"] == "not_shown"
    assert "removed_by" in entries[earlier]
