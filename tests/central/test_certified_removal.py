"""Certified Removal unit checks (baselines spec §4.7)."""

from __future__ import annotations

import torch
from central_problems import blobs

from fedunlearn.central import SGDSpec, SoftmaxRegression, make_method, train_sgd
from fedunlearn.central.methods.certified_removal import (
    _objective,
    certificate_constant,
    newton_removal,
)


def test_certificate_constant():
    assert abs(certificate_constant(1e-4) - 4.3854) < 1e-4


def test_newton_removal_shrinks_the_gradient_residual_and_bound_holds():
    x, y = blobs(n=200, d=5, classes=3)
    objective = SoftmaxRegression(x, y, 3, 0.01)
    record = train_sgd(objective, SGDSpec(lr=0.1, batch_size=20, passes=1))
    method = make_method("certified_removal", dict(l2=0.01, sigma=0.1, max_iter=1000))
    before = method.original(objective, record)
    assert method._state[4]["train_grad_norm"] < 1e-6  # solved to optimality
    forget = torch.tensor([0, 7, 42])
    result = method.unlearn(objective, record, forget)
    # residual of the perturbed objective on D' at the old and the new model (scaled features)
    xs, ys, scale = method._data(objective)
    keep = torch.ones(200, dtype=torch.bool)
    keep[forget] = False
    b = method._state[2]
    w_old = method._state[1]
    w_new = torch.cat([result.params[:15].view(3, 5), result.params[15:, None]], 1) * scale
    _, g_old = _objective(w_old, xs[keep], ys[keep], 0.01, b)
    _, g_new = _objective(w_new, xs[keep], ys[keep], 0.01, b)
    assert float(g_new.norm()) < 0.05 * float(g_old.norm())
    assert float(g_new.norm()) <= result.details["bound"]  # data-dependent bound (Cor. 1)
    assert not torch.equal(before, result.params)


def test_newton_is_exact_when_nothing_is_removed():
    x, y = blobs(n=60, d=3, classes=2)
    xs = torch.cat([x, torch.ones(60, 1, dtype=torch.float64)], 1) / 10
    ys = torch.where(torch.nn.functional.one_hot(y, 2) > 0, 1.0, -1.0).to(torch.float64)
    w = torch.randn(2, 4, dtype=torch.float64)
    out = newton_removal(w, xs, ys, xs[:0], ys[:0], 0.01)
    assert torch.equal(out, w)
