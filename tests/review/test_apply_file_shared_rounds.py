"""Review of issue 22: the apply file of a trajectory with a round that trained nobody.

Retrain's trajectory gives a round whose participants were all forgotten a zero aggregate and
the previous global model (docs/lifecycle.md): the same tensor as the round before. Writing
the apply file (``save_for_apply``, i.e. ``fedunlearn unlearn --out R.json``) then failed with
safetensors' "Some tensors share memory" RuntimeError, so such a request could not be applied.
"""

import pytest
import torch

from fedunlearn.config import parse_config
from fedunlearn.experiments import save_for_apply, unlearn_one
from fedunlearn.experiments.lifecycle import apply_file_path
from fedunlearn.history.result_file import read_result_file
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import train_run

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
        "participation": 0.25,  # one client a round
    },
    "history": {"policy": "all"},
}


@pytest.mark.slow
def test_a_round_that_trained_nobody_is_written_and_read_back(tmp_path):
    run = tmp_path / "run"
    train_run(parse_config(SMALL), run)
    with HistoryStore.open(run / "history") as store:
        (last,) = [c.client_id for c in store.client_records(2)]
    result, summary = unlearn_one(run, [last], "retrain", verify=False)
    out = tmp_path / "r.json"

    save_for_apply(out, summary, result)

    back = read_result_file(apply_file_path(out)).trajectory
    assert back is not None
    assert back.length == result.trajectory.length
    for mine, theirs in zip(back.rounds, result.trajectory.rounds, strict=True):
        assert torch.equal(mine.global_model, theirs.global_model)
    r1, r2 = back.rounds[0], back.rounds[1]
    assert r2.updates == {}
    assert torch.equal(r2.global_model, r1.global_model)
