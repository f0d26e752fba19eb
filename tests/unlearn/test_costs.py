"""The one cost record and the shared round bookkeeping (issue 20)."""

from pathlib import Path

import pytest
import torch

import fedunlearn.unlearn
from fedunlearn.fl.records import RoundRecord
from fedunlearn.unlearn import Costs, UnlearnRequest, UnlearnSession
from fedunlearn.unlearn.costs import CostMeter

UNLEARN = Path(fedunlearn.unlearn.__file__).parent


def test_the_meter_adds_to_the_costs_record_and_refuses_unknown_counters():
    meter = CostMeter()
    meter.add(rounds=1, client_epochs=3)
    meter.add(client_epochs=2)
    assert meter.costs == Costs(rounds=1, client_epochs=5)
    counts = {k: v for k, v in Costs(rounds=1, client_epochs=5).to_dict().items()}
    del counts["wall_seconds"]
    assert meter.counts() == counts
    with pytest.raises(ValueError, match="not a cost counter: wall_seconds"):
        meter.add(wall_seconds=1)
    with pytest.raises(ValueError, match="not a cost counter: round;"):
        meter.add(round=1)


def test_a_context_counts_each_round_it_closes_and_returns_its_row(run_all):
    with UnlearnSession(run_all) as session:
        context = session.context(UnlearnRequest.of([1]))
        params = session.run_view.final_params
        row = context.end_round(3, params)
        assert row == {"round": 3, **session.evaluation.evaluate(params)}
        record = RoundRecord(
            round=4,
            global_before=params,
            global_after=params,
            aggregate=torch.zeros_like(params),
            updates=(),
            rejected=(),
            metrics={"train_loss": 0.5},
        )
        assert context.record_round(record) == {"round": 4, "train_loss": 0.5}
        assert context.meter.costs.rounds == 2
    with UnlearnSession(run_all, evaluate=False) as session:
        context = session.context(UnlearnRequest.of([1]))
        assert context.end_round(1, session.run_view.final_params) == {"round": 1}
        assert context.meter.costs.rounds == 1


def test_no_method_counts_its_rounds_by_hand():
    by_hand = [
        f"{path.relative_to(UNLEARN)}:{n}"
        for path in sorted(UNLEARN.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if "rounds += " in line and "meter" in line
    ]
    assert by_hand == []
