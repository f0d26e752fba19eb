"""Checks MUV4-MUV5 of docs/methods/mini_unlearning.md (L-BFGS) and the exact oracles.

The closed-form oracles are checked against autograd.
"""

from __future__ import annotations

import math

import pytest
import torch
from central_problems import blobs, pick_forget

from fedunlearn.central import (
    AutogradObjective,
    ExactOracle,
    LBFGSOracle,
    SoftmaxRegression,
    forget_mask,
    make_method,
    replay_retrain,
    step_view,
)
from fedunlearn.linalg.lbfgs import CompactBFGS


def recursive_bfgs(pairs, sigma, dim):
    mat = sigma * torch.eye(dim, dtype=torch.float64)
    for s, y in pairs:
        bs = mat @ s
        mat = mat - torch.outer(bs, bs) / (s @ bs) + torch.outer(y, y) / (y @ s)
    return mat


def spec_cholesky_form(pairs, u, *, literal=False):
    """Algorithm 4 corrected (MU5), or the paper's literal L D L^T / sigma variant."""
    s_mat = torch.stack([s for s, _ in pairs], 1)
    y_mat = torch.stack([y for _, y in pairs], 1)
    m = s_mat.shape[1]
    sty = s_mat.T @ y_mat
    d = torch.diag(torch.diagonal(sty))
    low = torch.tril(sty, -1)
    s_last, y_last = s_mat[:, -1], y_mat[:, -1]
    sigma = float(y_last @ s_last) / float(s_last @ s_last)
    inner = low @ (d if literal else torch.linalg.inv(d)) @ low.T
    j = torch.linalg.cholesky(sigma * s_mat.T @ s_mat + inner)
    dh, dih = torch.sqrt(d), torch.diag(1 / torch.sqrt(torch.diagonal(d)))
    zero = torch.zeros(m, m, dtype=torch.float64)
    lower = torch.cat([torch.cat([dh, zero], 1), torch.cat([-low @ dih, j], 1)])
    upper = torch.cat([torch.cat([-dh, dih @ low.T], 1), torch.cat([zero, j.T], 1)])
    if literal:  # the paper's block placement
        upper = torch.cat([torch.cat([dh, -dih @ low.T], 1), torch.cat([zero, j.T], 1)])
    rhs = torch.cat([y_mat.T @ u, sigma * s_mat.T @ u])
    z = torch.linalg.solve_triangular(lower, rhs[:, None], upper=False)
    q = torch.linalg.solve_triangular(upper, z, upper=True).flatten()
    return sigma * u - torch.cat([y_mat, sigma * s_mat], 1) @ q


def test_compact_lbfgs_equals_recursive_bfgs_and_literal_fails():  # MUV4
    g = torch.Generator().manual_seed(3)
    dim = 12
    a = torch.randn(dim, dim, generator=g, dtype=torch.float64)
    hess = a @ a.T + dim * torch.eye(dim, dtype=torch.float64)
    pairs = []
    for _ in range(3):
        s = torch.randn(dim, generator=g, dtype=torch.float64)
        pairs.append((s, hess @ s))
    u = torch.randn(dim, generator=g, dtype=torch.float64)
    compact = CompactBFGS(pairs)
    explicit = recursive_bfgs(pairs, compact.sigma, dim)
    expected = explicit @ u
    scale = float(expected.norm())
    assert float((compact.matvec(u) - expected).norm()) <= 1e-10 * scale
    assert float((spec_cholesky_form(pairs, u) - expected).norm()) <= 1e-10 * scale
    literal = spec_cholesky_form(pairs, u, literal=True)
    assert float((literal - expected).norm()) > 1e-3 * scale
    s_new, y_new = pairs[-1]
    assert float((compact.matvec(s_new) - y_new).norm()) <= 1e-10 * float(y_new.norm())


@pytest.mark.slow
def test_lbfgs_in_recursion_close_to_exact_and_cross_batch_stays_finite():  # MUV5
    x, y = blobs()
    objective = SoftmaxRegression(x, y, 3, 0.005)
    from fedunlearn.central import SGDSpec, train_sgd

    record = train_sgd(objective, SGDSpec(lr=0.05, batch_size=32, passes=30, seed=0))
    forget = pick_forget(600, 0.10)
    reference, _ = replay_retrain(objective, record, forget)
    for k in (10, 50, 200):
        exact = make_method("mini_unlearning", dict(k=k)).unlearn(objective, record, forget)
        same = make_method("mini_unlearning", dict(k=k, hvp="lbfgs")).unlearn(
            objective, record, forget
        )
        cross = make_method(
            "mini_unlearning", dict(k=k, hvp="lbfgs", secants="cross_batch")
        ).unlearn(objective, record, forget)
        err_exact = float((exact.params - reference).norm())
        err_same = float((same.params - reference).norm())
        assert err_same <= 2.5 * err_exact
        assert math.isfinite(float(cross.params.norm()))
        assert "lbfgs_fallbacks" in cross.details


def test_closed_form_matches_autograd_and_oracles_agree():
    x, y = blobs(n=80, d=4)
    closed = SoftmaxRegression(x, y, 3, 0.01)
    auto = AutogradObjective(torch.nn.Linear(4, 3), x, y, 0.01)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(closed.num_params, generator=g, dtype=torch.float64)
    v = torch.randn(closed.num_params, generator=g, dtype=torch.float64)
    idx = torch.arange(0, 80, 3)
    assert torch.allclose(closed.grad_sum(w, idx), auto.grad_sum(w, idx), atol=1e-12)
    assert torch.allclose(closed.hvp_sum(w, idx, v), auto.hvp_sum(w, idx, v), atol=1e-12)
    assert abs(closed.loss_sum(w, idx) - auto.loss_sum(w, idx)) < 1e-10
    from fedunlearn.central import SGDSpec, train_sgd

    record = train_sgd(closed, SGDSpec(lr=0.05, batch_size=16, passes=2))
    view = step_view(record, forget_mask(80, torch.tensor([0, 5, 9])), record.num_steps)
    h_closed = ExactOracle(closed).matrix(view)
    h_auto = ExactOracle(auto).matrix(view)
    assert torch.allclose(h_closed, h_auto, atol=1e-12)
    assert torch.allclose(h_closed, h_closed.T, atol=1e-12)
    lbfgs = LBFGSOracle(closed, record, forget_mask(80, torch.tensor([0, 5, 9])))
    assert torch.isfinite(lbfgs.apply(view, v)).all()
