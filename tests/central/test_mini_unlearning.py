"""Checks MUV1-MUV3, MUV6-MUV8 of docs/methods/mini_unlearning.md, plus the history contract."""

from __future__ import annotations

import pytest
import torch
from central_problems import pick_forget

from fedunlearn.central import (
    ExactOracle,
    SGDSpec,
    contraction_diagnostics,
    correction,
    forget_mask,
    make_method,
    replay_retrain,
    step_view,
    train_sgd,
    unroll_horner,
)
from fedunlearn.errors import ConfigError, UnsupportedHistoryError


def dist(a, b):
    return float((a - b).norm())


def test_quadratic_full_unroll_equals_replay_and_error_shrinks_with_k(ridge):  # MUV1
    objective, record = ridge
    forget = pick_forget(600, 0.05)
    reference, _ = replay_retrain(objective, record, forget)
    errors = []
    for k in (1, 10, 50, 200, record.num_steps):
        result = make_method("mini_unlearning", dict(k=k)).unlearn(objective, record, forget)
        errors.append(dist(result.params, reference))
    assert errors[-1] <= 1e-10
    assert all(b < a for a, b in zip(errors, errors[1:], strict=False))
    assert errors[3] < 1e-3 * dist(record.final, reference)


def test_printed_sign_is_worse_than_nothing_and_fixed_sign_better(ridge):  # MUV2
    objective, record = ridge
    forget = pick_forget(600, 0.05)
    reference, _ = replay_retrain(objective, record, forget)
    mask = forget_mask(600, forget)
    views = [step_view(record, mask, s) for s in range(1, record.num_steps + 1)]
    nothing = dist(record.final, reference)
    fixed = record.final + unroll_horner(objective, views, ExactOracle(objective), sign=1)
    printed = record.final + unroll_horner(objective, views, ExactOracle(objective), sign=-1)
    assert dist(printed, reference) > nothing > dist(fixed, reference)


@pytest.mark.parametrize("ratio", [0.05, 0.15])
def test_logreg_full_unroll_is_ten_times_closer_than_original(logreg, ratio):  # MUV3
    objective, record = logreg
    forget = pick_forget(600, ratio)
    reference, _ = replay_retrain(objective, record, forget)
    full = make_method("mini_unlearning", dict(k_unit="all")).unlearn(objective, record, forget)
    assert dist(full.params, reference) * 10 < dist(record.final, reference)


def test_logreg_error_non_increasing_in_k_on_average_over_seeds(logreg):  # MUV3
    objective, record = logreg
    errors = torch.zeros(4)
    for seed in (1, 2, 3):
        forget = pick_forget(600, 0.10, seed)
        reference, _ = replay_retrain(objective, record, forget)
        for i, k in enumerate((10, 50, 200, record.num_steps)):
            result = make_method("mini_unlearning", dict(k=k)).unlearn(objective, record, forget)
            errors[i] += dist(result.params, reference) / 3
    assert bool((errors[1:] <= errors[:-1]).all())


@pytest.mark.parametrize("hvp", [pytest.param("exact", marks=pytest.mark.slow), "lbfgs"])
def test_engines_agree(logreg, hvp):  # MUV6
    objective, record = logreg
    forget = pick_forget(600, 0.15)
    common = {"k": 8, "hvp": hvp}
    horner = make_method("mini_unlearning", dict(engine="horner", **common)).unlearn(
        objective, record, forget
    )
    terms = make_method("mini_unlearning", dict(engine="terms", **common)).unlearn(
        objective, record, forget
    )
    workers = 2 if hvp == "exact" else 1  # one process-pool run keeps the suite fast
    explicit = make_method(
        "mini_unlearning", dict(engine="explicit", workers=workers, **common)
    ).unlearn(objective, record, forget)
    delta = horner.params - record.final
    scale = float(delta.norm())
    assert dist(terms.params, horner.params) <= 1e-10 * scale
    assert dist(explicit.params, horner.params) <= 1e-10 * scale


def test_explicit_basis_oracle_matches_exact(logreg):  # MUV6 (paper §4.2 basis matrices)
    objective, record = logreg
    forget = pick_forget(600, 0.10)
    exact = make_method("mini_unlearning", dict(k=6)).unlearn(objective, record, forget)
    basis = make_method("mini_unlearning", dict(k=6, hvp="explicit")).unlearn(
        objective, record, forget
    )
    assert dist(basis.params, exact.params) <= 1e-10 * dist(exact.params, record.final)


def test_posthoc_equals_paper_mode(logreg):  # MUV7
    objective, _ = logreg
    forget = pick_forget(600, 0.10)
    spec = SGDSpec(lr=0.05, batch_size=32, passes=30, seed=0)
    paper = train_sgd(objective, spec, paper_forget=forget, paper_window=20, keep_last=20)
    posthoc = train_sgd(objective, spec, keep_last=20)
    mask = forget_mask(600, forget)
    for step, stored in paper.corrections.items():
        view = step_view(posthoc, mask, step)
        recomputed = correction(
            objective, view.w_prev, view.w_next, view.batch, view.forgotten, spec.lr, shortcut=False
        )
        shortcut = correction(
            objective, view.w_prev, view.w_next, view.batch, view.forgotten, spec.lr
        )
        assert torch.allclose(stored, recomputed, rtol=0, atol=1e-12)
        assert torch.allclose(shortcut, recomputed, rtol=0, atol=1e-12)
        batch_sum = objective.grad_sum(view.w_prev, view.batch)
        identity = (len(view.batch) / spec.lr) * (view.w_prev - view.w_next)
        assert torch.allclose(identity, batch_sum, rtol=1e-9, atol=1e-9)
    a = make_method("mini_unlearning", dict(k=20)).unlearn(objective, paper, forget)
    b = make_method("mini_unlearning", dict(k=20)).unlearn(objective, posthoc, forget)
    assert a.details["paper_mode"]
    assert not b.details["paper_mode"]
    assert dist(a.params, b.params) <= 1e-12


def test_contraction_and_truncation_bound(ridge):  # MUV8
    objective, record = ridge
    forget = pick_forget(600, 0.05)
    mask = forget_mask(600, forget)
    k = 40
    views = [
        step_view(record, mask, s) for s in range(record.num_steps - k + 1, record.num_steps + 1)
    ]
    diag = contraction_diagnostics(views, ExactOracle(objective), iters=200)
    assert 0 < diag["r"] < 1  # eta = 0.05 < 2 / L on this problem
    reference, kept = replay_retrain(objective, record, forget, keep_steps=(record.num_steps - k,))
    gap_before = dist(kept[record.num_steps - k], record.iterate(record.num_steps - k))
    result = make_method("mini_unlearning", dict(k=k)).unlearn(objective, record, forget)
    # Theorem 1 (corrected): exact for a quadratic up to rounding, error <= r^k ||dw_{T-k}||.
    assert dist(result.params, reference) <= diag["r"] ** k * gap_before * (1 + 1e-6) + 1e-12


def test_special_cases_whole_batch_and_clean_batch(logreg):
    objective, record = logreg
    step = record.num_steps
    whole = record.batch(step)
    mask = forget_mask(600, whole)
    view = step_view(record, mask, step)
    g = correction(objective, view.w_prev, view.w_next, view.batch, view.forgotten, view.lr)
    assert torch.equal(g, view.w_prev - view.w_next)
    v = torch.randn(objective.num_params, dtype=torch.float64)
    assert torch.equal(ExactOracle(objective).apply(view, v), v)  # H = I
    clean = step_view(record, forget_mask(600, torch.tensor([], dtype=torch.int64)), step)
    g0 = correction(objective, clean.w_prev, clean.w_next, clean.batch, clean.forgotten, clean.lr)
    assert not g0.any()
    assert dist(ExactOracle(objective).apply(clean, v), v) > 1e-6  # H != I when dB = 0


def test_short_record_suffices_and_too_short_raises(logreg):
    objective, record = logreg
    forget = pick_forget(600, 0.10)
    short = train_sgd(objective, record.spec, keep_last=12)
    full = make_method("mini_unlearning", dict(k=10, hvp="lbfgs")).unlearn(
        objective, record, forget
    )
    small = make_method("mini_unlearning", dict(k=10, hvp="lbfgs")).unlearn(
        objective, short, forget
    )
    assert dist(full.params, small.params) <= 1e-12
    p = objective.num_params
    assert small.stored_bytes == (10 + 1 + 2) * p * 8 + 10 * 32 * 8  # O((k + m) p)
    with pytest.raises(UnsupportedHistoryError):
        make_method("mini_unlearning", dict(k=20)).unlearn(objective, short, forget)
    with pytest.raises(ConfigError):
        make_method("mini_unlearning", dict(k=0))


def test_k_units(logreg):
    objective, record = logreg
    forget = pick_forget(600, 0.05)
    one_pass = make_method("mini_unlearning", dict(k=1, k_unit="passes")).unlearn(
        objective, record, forget
    )
    steps = make_method("mini_unlearning", dict(k=record.steps_per_pass)).unlearn(
        objective, record, forget
    )
    assert one_pass.details["k_steps"] == record.steps_per_pass == 18
    assert torch.equal(one_pass.params, steps.params)
