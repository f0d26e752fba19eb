"""Starfish's steps: SecUE against the reference L-BFGS; TD, SecRS and SecTC on a recorded run."""

import math

import numpy as np
import pytest
import torch
from starfish_support import FORGET, LR, REMAINING, ROUNDS, cosine_ranking

from fedunlearn.linalg.lbfgs import CompactBFGS, GuardCounts, NoCurvaturePairsError
from fedunlearn.unlearn import UnlearnRequest
from fedunlearn.unlearn.starfish.backend.plain import PlainBackend
from fedunlearn.unlearn.starfish.backend.protocol import bitonic_comparators
from fedunlearn.unlearn.starfish.steps import (
    CurvatureBuffer,
    StageOneRecord,
    check_thresholds,
    select_rounds,
    switching_threshold,
    threshold_td1,
    thresholds_td2,
)


def test_switching_threshold_matches_the_paper():
    assert switching_threshold() == pytest.approx(1.58e8, rel=1e-2)  # exponent 27.24
    assert bitonic_comparators(40) == (36 + 6) * 64 // 4


# ---- (2) SecUE against the reference L-BFGS ----------------------------------------------------


def random_pairs(seed, m=7, count=3):
    gen = torch.Generator().manual_seed(seed)
    root = torch.randn(m, m, generator=gen, dtype=torch.float64)
    hessian = root @ root.T + m * torch.eye(m, dtype=torch.float64)
    pairs = []
    for _ in range(count):
        s = torch.randn(m, generator=gen, dtype=torch.float64)
        pairs.append((s, hessian @ s))
    return pairs, torch.randn(m, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("seed", range(3))
def test_compact_estimate_matches_the_linalg_compact_bfgs(seed):
    pairs, v = random_pairs(seed)
    be = PlainBackend()
    buffer = CurvatureBuffer(3, GuardCounts())
    for s, y in pairs:
        assert buffer.push(be, s, be.share(y), 0.0)
    expected = CompactBFGS(pairs).matvec(v)
    got = be.reveal(buffer.hessian_vector(be, v), "t")
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    g_old = torch.ones_like(v)
    est = be.reveal(buffer.estimate_compact(be, be.share(g_old), v), "t")
    torch.testing.assert_close(est, g_old + expected, rtol=1e-10, atol=1e-10)
    # v = 0: the stored gradient as it is, with or without pairs
    empty = CurvatureBuffer(2, GuardCounts())
    zero = torch.zeros_like(v)
    assert be.reveal(empty.estimate_compact(be, be.share(g_old), zero), "t").equal(g_old)
    with pytest.raises(NoCurvaturePairsError):
        empty.estimate_compact(be, be.share(g_old), v)


@pytest.mark.parametrize("seed", range(3))
def test_two_loop_estimate_matches_the_dense_inverse_bfgs(seed):
    pairs, g = random_pairs(seed)
    m = g.numel()
    inverse = torch.eye(m, dtype=torch.float64)  # H_0^{-1} = gamma0 I
    for s, y in pairs:  # H+^{-1} = V^T H^{-1} V + rho s s^T, V = I - rho y s^T (SF4)
        rho = 1.0 / float(y @ s)
        vmat = torch.eye(m, dtype=torch.float64) - rho * torch.outer(y, s)
        inverse = vmat.T @ inverse @ vmat + rho * torch.outer(s, s)
    be = PlainBackend()
    buffer = CurvatureBuffer(3, GuardCounts())
    for s, y in pairs:
        buffer.push(be, s, be.share(y), 0.0)
    got = be.reveal(buffer.estimate_two_loop(be, be.share(g)), "t")
    torch.testing.assert_close(got, inverse @ g, rtol=1e-10, atol=1e-10)


def test_buffer_keeps_the_newest_pairs_and_skips_degenerate_steps():
    pairs, _ = random_pairs(0, count=4)
    be = PlainBackend()
    counts = GuardCounts()
    buffer = CurvatureBuffer(2, counts, curvature_check=True)
    assert not buffer.push(be, torch.zeros(7, dtype=torch.float64), be.share(pairs[0][1]), 1.0)
    s, y = pairs[0]
    assert not buffer.push(be, s, be.share(-y), 1.0)  # negative curvature, one bit opened
    for s, y in pairs:
        buffer.push(be, s, be.share(y), 1.0)
    assert len(buffer) == 2
    assert buffer.pushed == 4
    assert counts.degenerate_step == 1
    assert counts.nonpositive_curvature == 1
    assert [o.label for o in be.opened].count("curvature_bit") == 5


# ---- (3) TD, SecRS and SecTC on a recorded run -------------------------------------------------


def test_td2_is_each_clients_max_quantile_and_td1_a_global_rank(session):
    context = session.context(FORGET)
    be = PlainBackend()
    alpha = 0.4
    record = StageOneRecord(context.history, be, -1.0 / LR, alpha)
    rounds = {c: list(range(1, ROUNDS + 1)) for c in REMAINING}
    td2 = thresholds_td2(be, record, rounds)
    grads = {
        (r, c): session.run_view.store.read_update(r, c).double().numpy() / -LR
        for r in range(1, ROUNDS + 1)
        for c in REMAINING
    }
    for c in REMAINING:
        expected = max(np.quantile(np.abs(grads[r, c]), 1 - alpha) for r in rounds[c])
        assert float(be.reveal(td2[c], "t")) == pytest.approx(expected**2, rel=1e-12)
    assert be.op_counts["setup"]["max"]["comparisons"] == len(REMAINING) * (ROUNDS - 1)
    td1 = threshold_td1(be, record, {r: REMAINING for r in range(1, ROUNDS + 1)}, alpha, 39)
    coords = np.sort(np.abs(np.concatenate(list(grads.values()))))[::-1]
    k = math.floor(alpha * coords.size) + 1
    assert float(be.reveal(td1, "t")) == pytest.approx(coords[k - 1] ** 2, rel=1e-12)
    assert not [o for o in be.opened if o.phase == "setup" and o.label != "t"]  # TD opens nothing


@pytest.mark.parametrize("method", ["method1", "method2", "alt_method1", "alt_method2"])
@pytest.mark.parametrize("targets", [(0,), (0, 1)], ids=["one_target", "two_targets"])
def test_secrs_selects_the_top_ceil_sigma_t_rounds_by_cosine(session, method, targets):
    context = session.context(UnlearnRequest.of(targets))
    be = PlainBackend()
    record = StageOneRecord(context.history, be, -1.0 / LR, 0.4)
    per_round = {r: list(targets) for r in range(1, ROUNDS + 1)}
    count = math.ceil(0.6 * ROUNDS)
    chosen = select_rounds(be, record, context.history.read_model, per_round, count, method)
    assert chosen == cosine_ranking(session, targets)[:count]
    assert len(chosen) == count == 8
    opened = [o for o in be.opened if o.label != "range_check"]
    assert [o.label for o in opened] == ["selected_rounds"]
    assert opened[0].value == tuple(float(r - 1) for r in chosen)  # opened round positions
    # a secure division or square root opens one bit: "every input lies in its range", and so
    # does Method 1's check of the client-supplied norms against norm_range (one target)
    checks = [o.value for o in be.opened if o.label == "range_check"]
    newton = method.endswith("method2") or not method.startswith("alt")
    assert checks == ([(1.0,)] * (1 + (method == "method2" and len(targets) > 1)) if newton else [])


def test_round_without_a_target_ranks_last(session):
    context = session.context(FORGET)
    be = PlainBackend()
    record = StageOneRecord(context.history, be, -1.0 / LR, 0.4)
    per_round = {r: ([] if r == 2 else [0]) for r in range(1, ROUNDS + 1)}
    chosen = select_rounds(be, record, context.history.read_model, per_round, ROUNDS, "method1")
    assert chosen[-1] == 2


def test_sectc_flags_a_client_iff_a_square_reaches_its_threshold():
    be = PlainBackend()
    estimates = {3: be.share(torch.tensor([0.1, -0.5, 0.2])), 7: be.share(torch.tensor([0.1]))}
    thresholds = {3: be.share(torch.tensor(0.25)), 7: be.share(torch.tensor(0.009))}
    assert check_thresholds(be, estimates, thresholds) == {3: True, 7: True}
    thresholds = {3: be.share(torch.tensor(0.26)), 7: be.share(torch.tensor(0.011))}
    assert check_thresholds(be, estimates, thresholds) == {3: False, 7: False}
    assert [o.label for o in be.opened] == ["correction_flags"] * 2
