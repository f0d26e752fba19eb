import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fedunlearn.errors import FedUnlearnError
from fedunlearn.linalg.lbfgs import (
    CompactBFGS,
    GuardCounts,
    NoCurvaturePairsError,
    SecantBuffer,
    compact_hvp,
    pair_problem,
)


def explicit_bfgs(s_mat, y_mat):
    """Dense B from recursive BFGS updates of B_0 = sigma I, pairs oldest -> newest."""
    p, k = s_mat.shape
    s_new, y_new = s_mat[:, -1], y_mat[:, -1]
    b = (y_new @ s_new) / (s_new @ s_new) * torch.eye(p, dtype=torch.float64)
    for j in range(k):
        s, y = s_mat[:, j], y_mat[:, j]
        bs = b @ s
        b = b - torch.outer(bs, bs) / (s @ bs) + torch.outer(y, y) / (y @ s)
    return b


def spd_problem(p, k, seed, noise=0.0):
    """Random SPD Hessian H, steps S, Y = H S (+ noise: S^T Y not symmetric), and v."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(p, p, generator=g, dtype=torch.float64)
    hessian = a @ a.T + 0.5 * torch.eye(p, dtype=torch.float64)
    s_mat = torch.randn(p, k, generator=g, dtype=torch.float64)
    v = torch.randn(p, generator=g, dtype=torch.float64)
    y_mat = hessian @ s_mat + noise * torch.randn(p, k, generator=g, dtype=torch.float64)
    return hessian, s_mat, y_mat, v


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 4), noise=st.sampled_from([0.0, 1.0]))
def test_compact_product_equals_explicit_recursive_bfgs(seed, k, noise):
    _, s_mat, y_mat, v = spd_problem(8, k, seed, noise)
    assume(bool(((s_mat * y_mat).sum(0) > 0.1 * s_mat.norm(dim=0) * y_mat.norm(dim=0)).all()))
    expected = explicit_bfgs(s_mat, y_mat) @ v
    got = compact_hvp(s_mat, y_mat, v)
    assert got.dtype == torch.float64
    assert torch.allclose(got, expected, rtol=1e-10, atol=1e-10 * float(expected.abs().max()))


def test_newest_pair_satisfies_the_secant_equation_and_older_ones_need_not():
    _, s_mat, y_mat, _ = spd_problem(10, 3, seed=1, noise=0.5)
    newest = compact_hvp(s_mat, y_mat, s_mat[:, -1].clone())
    assert torch.allclose(newest, y_mat[:, -1], rtol=1e-10, atol=1e-10)
    oldest = compact_hvp(s_mat, y_mat, s_mat[:, 0].clone())
    assert not torch.allclose(oldest, y_mat[:, 0], rtol=1e-6)  # only the newest (baselines.md)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_isotropic_curvature_gives_a_multiple_of_v(k):
    _, s_mat, _, v = spd_problem(12, k, seed=k)
    h = 0.37
    assert torch.allclose(compact_hvp(s_mat, h * s_mat, v), h * v, rtol=1e-12, atol=1e-13)


def test_buffer_keeps_the_newest_pairs_and_matches_the_matrix_form():
    _, s_mat, y_mat, v = spd_problem(8, 4, seed=3)
    buffer = SecantBuffer(capacity=2)
    for j in range(4):
        assert buffer.push(s_mat[:, j], y_mat[:, j])
    assert len(buffer) == 2
    assert torch.equal(buffer.pairs[0][0], s_mat[:, 2])
    expected = explicit_bfgs(s_mat[:, 2:], y_mat[:, 2:]) @ v
    assert torch.allclose(buffer.hvp(v), expected, rtol=1e-10, atol=1e-12)
    assert torch.equal(buffer.hvp(v), buffer.hvp(v))  # cached setup reused


def test_float32_vectors_stay_float32_and_close_to_float64():
    _, s_mat, y_mat, v = spd_problem(50, 2, seed=4)
    exact = compact_hvp(s_mat, y_mat, v)
    got = compact_hvp(s_mat.float(), y_mat.float(), v.float())
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), exact, rtol=1e-4, atol=1e-4 * float(exact.abs().max()))


def test_degenerate_and_negative_curvature_pairs_are_skipped_and_counted():
    counts = GuardCounts()
    buffer = SecantBuffer(2, counts)
    s = torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)
    assert not buffer.push(torch.zeros(3, dtype=torch.float64), s)  # guard (a)
    assert not buffer.push(1e-14 * s, s, w_norm=10.0)  # ||s|| below 1e-12 (1 + ||w||)
    assert not buffer.push(s, -s)  # guard (b): s^T y < 0
    assert not buffer.push(s, torch.zeros(3, dtype=torch.float64))  # zero curvature
    assert len(buffer) == 0
    assert counts.to_dict() == {
        "degenerate_step": 2,
        "nonpositive_curvature": 2,
        "ill_conditioned": 0,
        "no_pairs": 0,
    }
    assert pair_problem(s, 2 * s) is None
    assert pair_problem(1e-6 * s, 2e-6 * s) is None


def test_no_usable_pair_raises_a_clear_error_unless_v_is_zero():
    counts = GuardCounts()
    buffer = SecantBuffer(2, counts)
    v = torch.ones(3)
    assert torch.equal(buffer.hvp(torch.zeros(3)), torch.zeros(3))  # B 0 = 0, no pair needed
    with pytest.raises(NoCurvaturePairsError, match="no usable pair"):
        buffer.hvp(v)
    assert counts.no_pairs == 1
    assert issubclass(NoCurvaturePairsError, FedUnlearnError)
    with pytest.raises(NoCurvaturePairsError):
        compact_hvp(torch.zeros(3, 0), torch.zeros(3, 0), v)
    with pytest.raises(NoCurvaturePairsError):
        CompactBFGS([])


def test_ill_conditioned_system_drops_the_oldest_pair():
    hessian, s_mat, _, v = spd_problem(6, 2, seed=5)
    # Collinear pairs keep M well conditioned (a repeated BFGS update is idempotent), but pairs
    # of very different lengths do not: cond(M) ~ (||s_new|| / ||s_old||)^2 = 1e16.
    s_old, s_new = 1e-8 * s_mat[:, 0], s_mat[:, 1]
    counts = GuardCounts()
    operator = CompactBFGS([(s_old, hessian @ s_old), (s_new, hessian @ s_new)], counts)
    assert counts.ill_conditioned == 1
    assert operator.num_pairs == 1
    assert operator.dropped == 1
    single = explicit_bfgs(s_new[:, None], (hessian @ s_new)[:, None]) @ v
    assert torch.allclose(operator.matvec(v), single, rtol=1e-10, atol=1e-10)
    both = CompactBFGS(
        [(1e-3 * s_mat[:, 0], hessian @ s_mat[:, 0] * 1e-3), (s_new, hessian @ s_new)]
    )
    assert both.num_pairs == 2  # a 1e6 condition number is acceptable


def test_mismatched_shapes_are_rejected():
    with pytest.raises(ValueError, match="p x k"):
        compact_hvp(torch.zeros(3, 2), torch.zeros(3, 1), torch.ones(3))
    with pytest.raises(ValueError, match="capacity"):
        SecantBuffer(0)
