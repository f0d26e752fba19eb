"""SecDiv, reciprocal, secure sqrt and SecMI against float64 (spec §3.5, §3.6, §13 V1)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedunlearn.errors import ConfigError, SecureComputationError
from fedunlearn.mpc import (
    FixedPoint,
    run_two_party,
    sec_div,
    sec_inverse,
    sec_reciprocal,
    sec_share,
    sec_sqrt,
)


def shared(party, x, owner=0):
    return sec_share(party, x if party.party_id == owner else None, owner)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from([(0.5, 2.0), (1.0, 100.0), (0.01, 10.0)]))
def test_sec_div_matches_float_within_fixed_point_error(seed, v_range):
    rng = np.random.default_rng(seed)
    u = rng.uniform(-10, 10, 50)
    v = np.exp(rng.uniform(np.log(v_range[0]), np.log(v_range[1]), 50))
    got, _ = run_two_party(lambda p: sec_div(shared(p, u), shared(p, v, 1), v_range).reveal())
    # relative error of the reciprocal is a few LSB times rho = sqrt(hi / lo)
    rho = np.sqrt(v_range[1] / v_range[0])
    assert np.all(np.abs(got - u / v) <= 2e-3 * rho * (1 + np.abs(u / v)))


def test_reciprocal_reaches_full_precision_on_a_narrow_range():
    v = np.linspace(1.0, 4.0, 31)
    got, _ = run_two_party(
        lambda p: sec_reciprocal(shared(p, v), (1.0, 4.0)).reveal(), fixed_point=FixedPoint(20)
    )
    np.testing.assert_allclose(got, 1 / v, rtol=0, atol=2e-5)


def test_secure_sqrt_matches_numpy():
    x = np.array([0.01, 0.5, 1.0, 2.0, 9.0, 50.0, 100.0])
    got, _ = run_two_party(lambda p: sec_sqrt(shared(p, x), (0.01, 100.0)).reveal())
    np.testing.assert_allclose(got, np.sqrt(x), rtol=5e-3, atol=5e-3)


def test_a_bad_public_range_is_a_config_error():
    with pytest.raises(ConfigError, match="range"):
        run_two_party(lambda p: sec_div(shared(p, [1.0]), shared(p, [1.0]), (0.0, 1.0)))


def random_well_conditioned(rng, m, count):
    """U diag(s) V^T with singular values s in [1, 4]: condition number at most 4."""
    u = np.linalg.qr(rng.normal(size=(count, m, m)))[0]
    v = np.linalg.qr(rng.normal(size=(count, m, m)))[0]
    s = rng.uniform(1, 4, size=(count, 1, m))
    return (u * s) @ np.swapaxes(v, 1, 2)


@pytest.mark.parametrize(
    ("frac_bits", "m", "tolerance"), [(13, 4, 1e-2), (20, 4, 1e-4), (13, 8, 1e-2), (20, 8, 1e-4)]
)
def test_secmi_relative_error_meets_the_v1_criterion(frac_bits, m, tolerance):
    # Prepare: 4x4 and 2B x 2B (B = 4) well-conditioned matrices, 5 of each
    rng = np.random.default_rng(frac_bits + m)
    x = random_well_conditioned(rng, m, 5)

    def program(p):
        inv = sec_inverse(shared(p, x))
        return inv.reveal()

    # Execute
    got, other = run_two_party(program, fixed_point=FixedPoint(frac_bits))
    # Assert
    exact = np.linalg.inv(x)
    errors = np.linalg.norm(got - exact, axis=(1, 2)) / np.linalg.norm(exact, axis=(1, 2))
    assert np.all(errors < tolerance), errors
    np.testing.assert_array_equal(got, other)


def test_secmi_costs_one_matmul_and_one_open():
    x = np.eye(3) * 2.0

    def program(p):
        a = shared(p, x)
        before = dict(vars(p.counters.online))
        sec_inverse(a)
        return {k: v - before[k] for k, v in vars(p.counters.online).items()}

    cost, _ = run_two_party(program)
    # SecMul round sends X - A and R - B (2 m^2 words); the open sends N (m^2 words)
    assert cost == {
        "bytes_sent": 3 * 9 * 8,
        "bytes_received": 3 * 9 * 8,
        "rounds": 2,
        "messages": 2,
    }


def test_secmi_of_a_singular_matrix_raises():
    x = np.array([[1.0, 2.0], [2.0, 4.0]])
    with pytest.raises(SecureComputationError, match="condition number"):
        run_two_party(lambda p: sec_inverse(shared(p, x)))
