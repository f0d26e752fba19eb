"""Theorem 1: both forms of Eq. 5, and the corrected bound on L2-regularised regression."""

import json
import math

import pytest
import torch
from starfish_support import FORGET, LR, REMAINING, ROUNDS, WEIGHT_DECAY

from fedunlearn.unlearn import make_method
from fedunlearn.unlearn.starfish.bound import (
    corrected_bound,
    evaluate_theorem1,
    literal_bound,
    regularised_loss,
    retrain_trajectory,
)


def test_bound_formulas():
    # literal Eq. 5 with mu = 4, sigma = 0.5: 2 sqrt(eta (1/4 + 1/(0.5 * 2)) dF t_i)
    assert literal_bound(3, step_size=0.1, mu=4.0, selection_rate=0.5, objective_gap=2.0) == (
        pytest.approx(2 * math.sqrt(0.1 * 1.25 * 2.0 * 3))
    )
    assert literal_bound(3, step_size=0.1, mu=1.0, selection_rate=0.5, objective_gap=2.0) is None
    # corrected with t = t_i / sigma equals Eq. 5 with (2 - mu)
    assert corrected_bound(3, 6, step_size=0.1, mu=0.5, objective_gap=2.0) == pytest.approx(
        2 * math.sqrt(0.1 * (1 / 0.5 + 1 / (0.5 * 1.5)) * 2.0 * 3)
    )
    assert corrected_bound(3, 6, step_size=0.1, mu=2.5, objective_gap=2.0) is None


def test_corrected_theorem1_bound_holds_on_l2_logistic_regression(session):
    sigma = 0.6
    result = session.run(
        make_method("starfish", {"selection_rate": sigma, "record_models": True}), FORGET
    )
    context = session.context(FORGET)
    retrain = retrain_trajectory(context)
    assert context.meter.costs.client_epochs == 0  # the reference retrain is not charged
    data = [session.federation.client_data[c] for c in REMAINING]
    objective_gap = regularised_loss(session.federation.model, retrain[0], data, WEIGHT_DECAY)
    report = evaluate_theorem1(
        result.details.trajectory,
        retrain,
        selection_rate=sigma,
        step_size=LR,
        mu=WEIGHT_DECAY,
        objective_gap=objective_gap,
    )
    assert len(report.rows) == 8
    assert report.rows[-1].t == ROUNDS  # ceil(8 / 0.6) capped at T
    assert report.corrected_holds
    assert report.literal_holds is None
    assert all(0 < row.observed < row.corrected for row in report.rows)
    assert torch.equal(torch.tensor(result.details.trajectory[-1]), result.params)
    json.dumps(result.details.to_dict())  # JSON-ready, trajectory included
    assert report.to_dict()["rows"][0]["t"] == 2
