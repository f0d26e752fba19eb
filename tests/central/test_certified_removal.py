"""Certified Removal unit checks (CR1-CR9, docs/methods/central_baselines.md)."""

from __future__ import annotations

import torch
from central_problems import blobs

from fedunlearn.central import SGDSpec, SoftmaxRegression, make_method, train_sgd
from fedunlearn.central.baselines.certified_removal import (
    _objective,
    certificate_constant,
    newton_removal,
    newton_update,
    removal_budget,
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


# --- the removal step, the bound and the budget (issue 14) ------------------------------------


def _ridge_pieces(x, y, lam):
    """Least squares 1/2 ||x w - y||^2 + lam n / 2 ||w||^2: minimiser, per-sample grads, HVP."""

    def minimiser(xs, ys):
        n = len(xs)
        return torch.linalg.solve(
            xs.T @ xs + lam * n * torch.eye(xs.shape[1], dtype=xs.dtype), xs.T @ ys
        )

    def removed_gradient(w, xs, ys):
        return xs.T @ (xs @ w - ys) + lam * len(xs) * w

    def hvp(xs):
        return lambda v: xs.T @ (xs @ v) + lam * len(xs) * v

    return minimiser, removed_gradient, hvp


def test_newton_update_is_exact_for_least_squares_with_the_kept_hessian():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(80, 4, dtype=torch.float64, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    y = y + 0.3 * torch.randn(80, dtype=torch.float64, generator=g)
    x[-1] *= 20  # a strongly leveraged point among the removed ones
    minimiser, removed_gradient, hvp = _ridge_pieces(x, y, 0.01)
    keep = torch.ones(80, dtype=torch.bool)
    keep[[5, 17, 79]] = False
    w_full = minimiser(x, y)
    w_new, residual = newton_update(
        w_full, removed_gradient(w_full, x[~keep], y[~keep]), hvp(x[keep])
    )
    assert torch.allclose(w_new, minimiser(x[keep], y[keep]), atol=1e-8, rtol=0)
    assert residual < 1e-6
    # a Hessian over every point (removed ones included) misses the retrained minimiser
    w_all, _ = newton_update(w_full, removed_gradient(w_full, x[~keep], y[~keep]), hvp(x))
    assert float((w_all - minimiser(x[keep], y[keep])).norm()) > 1e-2


def _leveraged_problem():
    x, y = blobs(n=120, d=4, classes=2)
    far = 6 * x[:1].sign() * x.abs().max()  # far from every other point, labelled against its side
    return torch.cat([x, far]), torch.cat([y, 1 - y[:1]])


def test_removing_a_strongly_leveraged_point_leaves_almost_no_gradient_residual():
    x, y = _leveraged_problem()
    objective = SoftmaxRegression(x, y, 2, 0.01)
    record = train_sgd(objective, SGDSpec(lr=0.1, batch_size=20, passes=1))
    method = make_method("certified_removal", dict(l2=0.01, sigma=0.1, max_iter=1000))
    method.original(objective, record)
    n = len(x)
    result = method.unlearn(objective, record, torch.tensor([n - 1]))
    xs, ys, scale = method._data(objective)
    keep = torch.ones(n, dtype=torch.bool)
    keep[-1] = False
    w_old, b = method._state[1], method._state[2]
    w_new = torch.cat([result.params[:8].view(2, 4), result.params[8:, None]], 1) * scale
    _, g_old = _objective(w_old, xs[keep], ys[keep], 0.01, b)
    _, g_new = _objective(w_new, xs[keep], ys[keep], 0.01, b)
    # the kept Hessian leaves ~1e-5 of the residual; one over all points (the removed outlier's
    # curvature included) leaves ~0.17 of it on this problem
    assert float(g_new.norm()) < 1e-3 * float(g_old.norm())
    assert float(g_new.norm()) <= result.details["bound"]


def test_bound_is_gamma_times_the_data_dependent_terms_plus_the_solve_residuals():
    x, y = blobs(n=200, d=5, classes=3)
    objective = SoftmaxRegression(x, y, 3, 0.01)
    record = train_sgd(objective, SGDSpec(lr=0.1, batch_size=20, passes=1))
    forget = torch.tensor([0, 7, 42])
    results = {}
    for gamma in (0.25, 0.5):
        method = make_method("certified_removal", dict(l2=0.01, sigma=0.1, gamma=gamma))
        method.original(objective, record)
        results[gamma] = method.unlearn(objective, record, forget).details
    xs, _, _ = method._data(objective)
    keep = torch.ones(200, dtype=torch.bool)
    keep[forget] = False
    w_old = method._state[1]
    details = results[0.25]
    # recompute Cor. 1's term by hand from the removal step u = w- - w*
    scale = details["feature_scale"]
    params = method.unlearn(objective, record, forget).params
    w_new = torch.cat([params[:15].view(3, 5), params[15:, None]], 1) * scale
    u = w_new - w_old
    norm_x = float(torch.linalg.matrix_norm(xs[keep], ord=2))
    by_hand = sum(
        0.25 * norm_x * float(u[c].norm()) * float((xs[keep] @ u[c]).norm()) for c in range(3)
    )
    assert abs(details["bound_newton"] - by_hand) <= 1e-3 * by_hand
    assert abs(results[0.5]["bound_newton"] - 2 * details["bound_newton"]) <= 1e-9 * by_hand
    total = details["bound_newton"] + details["train_residual"] + details["solve_residual"]
    assert details["bound"] == total


def test_bound_holds_when_the_training_solve_stopped_early():
    x, y = blobs(n=200, d=5, classes=3)
    objective = SoftmaxRegression(x, y, 3, 0.01)
    record = train_sgd(objective, SGDSpec(lr=0.1, batch_size=20, passes=1))
    method = make_method("certified_removal", dict(l2=0.01, sigma=0.1, max_iter=3))
    method.original(objective, record)
    forget = torch.tensor([0, 7, 42])
    result = method.unlearn(objective, record, forget)
    assert result.details["train_residual"] > 1e-3  # three L-BFGS iterations: not converged
    xs, ys, scale = method._data(objective)
    keep = torch.ones(200, dtype=torch.bool)
    keep[forget] = False
    w_new = torch.cat([result.params[:15].view(3, 5), result.params[15:, None]], 1) * scale
    _, g_new = _objective(w_new, xs[keep], ys[keep], 0.01, method._state[2])
    residual = float(g_new.norm())
    assert residual > result.details["bound_newton"]  # Cor. 1's term alone would not hold
    assert residual <= result.details["bound"]


def test_budget_accounting_retrains_only_past_sigma_epsilon_over_c():
    assert removal_budget(0.1, 1.0, 1e-4) == 0.1 * 1.0 / certificate_constant(1e-4)
    assert removal_budget(0.2, 1.0, 1e-4) > removal_budget(0.1, 1.0, 1e-4)  # more noise
    assert removal_budget(0.1, 2.0, 1e-4) > removal_budget(0.1, 1.0, 1e-4)  # weaker epsilon
    assert removal_budget(0.1, 1.0, 1e-6) < removal_budget(0.1, 1.0, 1e-4)  # smaller delta
    x, y = _leveraged_problem()
    objective = SoftmaxRegression(x, y, 2, 0.01)
    record = train_sgd(objective, SGDSpec(lr=0.1, batch_size=20, passes=1))
    outlier = torch.tensor([len(x) - 1])
    verdicts = {}
    for sigma in (0.01, 100.0):
        method = make_method("certified_removal", dict(l2=0.01, sigma=sigma, max_iter=1000))
        method.original(objective, record)
        details = method.unlearn(objective, record, outlier).details
        assert details["budget"] == removal_budget(sigma, 1.0, 1e-4)
        assert details["would_retrain"] == (details["bound"] > details["budget"])
        verdicts[sigma] = details["would_retrain"]
    assert verdicts == {0.01: True, 100.0: False}
