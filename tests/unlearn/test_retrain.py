"""Retrain under partial participation asks the original run's participants, minus the forgotten."""

import pytest
import torch

from fedunlearn.config import parse_config
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

PARTIAL = {
    "seed": 3,
    "data": {"dataset": "digits", "num_clients": 10},
    "model": {"name": "mlp", "hidden": [16]},
    "training": {
        "rounds": 3,
        "local_epochs": 1,
        "lr": 0.3,
        "batch_size": 32,
        "participation": 0.2,
        "executor": "serial",
    },
    "history": {"policy": "none"},
}


@pytest.fixture(scope="module")
def partial_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("partial") / "run"
    train_run(parse_config(PARTIAL), run)
    with HistoryStore.open(run / "history") as store:
        sampled = {r: {c.client_id for c in store.client_records(r)} for r in (1, 2, 3)}
    return run, sampled


def test_forgetting_a_client_that_never_took_part_reproduces_the_original(partial_run):
    run, sampled = partial_run
    absent = min(set(range(10)) - set().union(*sampled.values()))
    with UnlearnSession(run) as session:
        result = session.run(make_method("retrain"), UnlearnRequest.of([absent]))
        assert torch.equal(result.params, session.run_view.final_params)
    assert result.costs.client_participations == sum(len(s) for s in sampled.values())


def test_retrain_asks_each_rounds_participants_minus_the_forgotten(partial_run):
    run, sampled = partial_run
    forgotten = min(sampled[1])
    with UnlearnSession(run) as session:
        result = session.run(make_method("retrain"), UnlearnRequest.of([forgotten]))
    expected = sum(len(s - {forgotten}) for s in sampled.values())
    assert result.costs.client_participations == expected
    assert result.costs.rounds == 3
    assert len(result.round_metrics) == 3
    assert [r["round"] for r in result.round_metrics] == [1, 2, 3]
