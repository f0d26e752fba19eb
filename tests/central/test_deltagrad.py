"""DeltaGrad unit checks (baselines spec §3.7)."""

from __future__ import annotations

import pytest
import torch
from central_problems import pick_forget

from fedunlearn.central import SGDSpec, make_method, replay_retrain, train_sgd
from fedunlearn.errors import UnsupportedHistoryError


class IsotropicQuadratic:
    """F_j(w) = (h/2) ||w - c_j||^2 + (lam/2) ||w||^2: every Hessian is (h + lam) I."""

    def __init__(self, centers: torch.Tensor, h: float, l2: float) -> None:
        self.c, self.h, self.l2 = centers, h, l2
        self.num_samples, self.num_params = centers.shape

    def grad_sum(self, w, idx):
        return self.h * (len(idx) * w - self.c[idx].sum(0)) + self.l2 * len(idx) * w

    def hvp_sum(self, w, idx, v):
        return (self.h + self.l2) * len(idx) * v

    def loss_sum(self, w, idx):
        return float(0.5 * self.h * ((w - self.c[idx]) ** 2).sum())


def test_burn_in_covering_all_steps_is_replay(logreg):
    objective, record = logreg
    forget = pick_forget(600, 0.10)
    reference, _ = replay_retrain(objective, record, forget)
    result = make_method("deltagrad", dict(burn_in=record.num_steps)).unlearn(
        objective, record, forget
    )
    assert float((result.params - reference).norm()) <= 1e-12
    assert result.details["exact_steps"] == record.num_steps


def test_isotropic_quadratic_is_replay():
    g = torch.Generator().manual_seed(0)
    objective = IsotropicQuadratic(torch.randn(200, 6, generator=g, dtype=torch.float64), 0.7, 0.01)
    record = train_sgd(objective, SGDSpec(lr=0.1, batch_size=20, passes=5), cache_batch_grads=True)
    forget = pick_forget(200, 0.10)
    reference, _ = replay_retrain(objective, record, forget)
    result = make_method("deltagrad", dict(period=5, burn_in=2)).unlearn(objective, record, forget)
    assert result.details["exact_steps"] < record.num_steps / 3
    assert float((result.params - reference).norm()) <= 1e-10 * float(reference.norm())


def test_close_to_replay_on_logreg(logreg):
    objective, record = logreg
    forget = pick_forget(600, 0.05)
    reference, _ = replay_retrain(objective, record, forget)
    result = make_method("deltagrad", dict(period=5, burn_in=10)).unlearn(objective, record, forget)
    gap = float((record.final - reference).norm())
    assert float((result.params - reference).norm()) < 0.1 * gap
    p, steps = objective.num_params, record.num_steps
    assert result.stored_bytes == 2 * steps * p * 8 + steps * 32 * 8  # O(T p)


def test_needs_full_cache(logreg):
    objective, record = logreg
    short = train_sgd(objective, record.spec, keep_last=5)
    with pytest.raises(UnsupportedHistoryError):
        make_method("deltagrad").unlearn(objective, short, pick_forget(600, 0.05))
