"""SecDiv, reciprocal, secure sqrt and SecMI against float64 (MPC7, MPC8 in docs/mpc.md)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedunlearn.errors import ConfigError, SecureComputationError
from fedunlearn.mpc import (
    FixedPoint,
    SharedTensor,
    ge_cost,
    run_two_party,
    sec_check_range,
    sec_div,
    sec_inverse,
    sec_reciprocal,
    sec_share,
    sec_sqrt,
)
from fedunlearn.mpc.dealer import MASK_ENTRY_BOUND
from fedunlearn.mpc.protocols.secmi import TARGET_RING_BITS, public_bits


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


# Tolerances from the measured spread (60 dealer seeds x 5 matrices each, 2026-11-25): since a
# mask never shrinks X (s in [0, 2k], MPC8 in docs/mpc.md) the relative error at f = 20, m = 8
# is median 1.9e-5, p99 1.0e-4, max 1.24e-4 (before: 7.4e-6 / 5.6e-5 / 9.1e-5), and at f = 13
# median 3.2e-4, max 7.5e-4 (before: 4.0e-4, max 1.1e-2: a small mask lost the precision of a
# small X). The dealer seed is fixed so that the test is deterministic.
@pytest.mark.parametrize(
    ("frac_bits", "m", "tolerance"), [(13, 4, 1e-2), (20, 4, 2e-4), (13, 8, 1e-2), (20, 8, 2e-4)]
)
@pytest.mark.parametrize("dealer_seed", [1, 2])
def test_secmi_relative_error_meets_the_v1_criterion(frac_bits, m, tolerance, dealer_seed):
    # Prepare: 4x4 and 2B x 2B (B = 4) well-conditioned matrices, 5 of each
    rng = np.random.default_rng(frac_bits + m)
    x = random_well_conditioned(rng, m, 5)

    def program(p):
        inv = sec_inverse(shared(p, x))
        return inv.reveal()

    # Execute
    got, other = run_two_party(
        program, fixed_point=FixedPoint(frac_bits), dealer_seed=dealer_seed, local_seed=dealer_seed
    )
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


def test_an_input_outside_the_declared_range_raises_instead_of_returning_garbage():
    # Issue 15: Newton division and sqrt returned garbage silently outside the range
    u, v = np.array([1.0, 2.0, 3.0]), np.array([0.5, 1.0, 50.0])  # 50 is outside (0.5, 2)

    def program(p, check_range):
        return sec_div(shared(p, u), shared(p, v, 1), (0.5, 2.0), check_range=check_range)

    unchecked, _ = run_two_party(lambda p: program(p, False).reveal())
    assert abs(unchecked[2] - 3.0 / 50.0) > 0.1  # what the unguarded protocol returns
    with pytest.raises(SecureComputationError, match=r"outside the declared range \[0.5, 2\]"):
        run_two_party(lambda p: program(p, True))
    with pytest.raises(SecureComputationError, match="sec_sqrt"):
        run_two_party(lambda p: sec_sqrt(shared(p, np.array([0.001, 1.0])), (0.01, 100.0)))


def test_the_range_guard_opens_one_bit_and_passes_inputs_in_range():
    v = np.array([0.5, 1.0, 2.0, 1.5])

    def program(p):
        x = shared(p, v)
        before = p.counters.snapshot()["online"]
        sec_check_range(x, (0.5, 2.0), "test")
        after = p.counters.snapshot()["online"]
        return {k: after[k] - before[k] for k in after}

    cost, _ = run_two_party(program)
    # two SecGE calls (8 rounds each) and one opening of a single ring element (1 round)
    opened = cost["bytes_sent"] - ge_cost(8, 0)["online"]["bytes_sent"]
    opened -= ge_cost(1, 0)["online"]["bytes_sent"]
    assert opened == 8
    assert cost["rounds"] == 17


def test_secmi_keeps_its_truncated_product_near_2_to_the_40():
    # Issue 15: SecMI scaled its product to ~2^48 before local truncation (failure 2^-15 per
    # element); the public N^-1 now gets the bits that keep the bound at 2^40 (2^-23)
    rng = np.random.default_rng(3)
    x = random_well_conditioned(rng, 4, 20)
    seen = []

    def program(p):
        original = SharedTensor.matmul_public

        def spy(self, matrix, *, left=False, public_frac_bits=None):
            seen.append((np.asarray(matrix), public_frac_bits))
            return original(self, matrix, left=left, public_frac_bits=public_frac_bits)

        if p.party_id == 0:
            SharedTensor.matmul_public = spy
        try:
            return sec_inverse(shared(p, x)).reveal()
        finally:
            SharedTensor.matmul_public = original

    got, _ = run_two_party(program, fixed_point=FixedPoint(13))
    inverse, bits = seen[0]
    mask_bound = MASK_ENTRY_BOUND * 2.0**4  # max|R|: entries <= 4, scale 2^s with s <= 2k = 4
    bound = 4 * mask_bound * np.max(np.abs(inverse)) * 2.0 ** (13 + bits)  # m max|R| max|N^-1|
    assert np.log2(bound) <= TARGET_RING_BITS
    assert public_bits(inverse, mask_bound, 13) == bits
    truth = np.linalg.inv(x)
    assert np.max(np.abs(got - truth) / np.abs(truth).max()) < 1e-2


def test_run_two_party_draws_a_fresh_dealer_seed_by_default():
    a, _ = run_two_party(lambda p: p.dealer.triple((4,))[0])
    b, _ = run_two_party(lambda p: p.dealer.triple((4,))[0])
    c, _ = run_two_party(lambda p: p.dealer.triple((4,))[0], dealer_seed=1)
    d, _ = run_two_party(lambda p: p.dealer.triple((4,))[0], dealer_seed=1)
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(c, d)
