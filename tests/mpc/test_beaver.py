"""Beaver protocols against numpy: SecMul, matmul, SecSP, square, SecMul3, SecSel (spec §3.3)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fedunlearn.mpc import (
    FixedPoint,
    run_two_party,
    sec_constant,
    sec_ge,
    sec_inner,
    sec_matmul,
    sec_mul,
    sec_mul3,
    sec_mul_many,
    sec_select,
    sec_share,
    sec_square,
)

LSB = 2.0**-13
small = st.floats(min_value=-100, max_value=100, allow_nan=False)


def shared(party, x, owner=0, frac_bits=None):
    return sec_share(party, x if party.party_id == owner else None, owner, frac_bits)


def product_bound(x, y):
    """Encoding error (half an LSB per operand, times the other one) plus one truncation LSB."""
    return (0.5 * np.abs(x) + 0.5 * np.abs(y) + 0.25 + 1.0) * LSB


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(small, small), min_size=1, max_size=16))
def test_sec_mul_matches_numpy_within_the_truncation_bound(pairs):
    x, y = np.array(pairs).T
    got, other = run_two_party(lambda p: sec_mul(shared(p, x), shared(p, y, 1)).reveal())
    assert np.all(np.abs(got - x * y) <= product_bound(x, y))
    np.testing.assert_array_equal(got, other)


def test_sec_mul_of_zero_and_negatives_and_broadcasting():
    x = np.array([[0.0, -1.5, 2.0], [-3.0, -0.25, 0.0]])
    y = np.array([-2.0, -4.0, 0.0])
    got, _ = run_two_party(lambda p: (shared(p, x) * shared(p, y, 1)).reveal())
    np.testing.assert_array_equal(got, x * y)  # all exactly representable


def test_untruncated_products_are_exact_at_scale_2f():
    x, y = np.array([1.5, -0.0001, 3.0]), np.array([1 / 3, 7.0, -2.0])

    def program(p):
        z = sec_mul(shared(p, x), shared(p, y, 1), truncate=False)
        return z.frac_bits, z.reveal()

    (bits, got), _ = run_two_party(program)
    fx, fy = np.round(x * 2**13) / 2**13, np.round(y * 2**13) / 2**13
    assert bits == 26
    np.testing.assert_array_equal(got, fx * fy)


def test_bit_times_value_needs_no_truncation_and_select_is_exact():
    bits = np.array([1, 0, 1, 0])
    a, b = np.array([1.25, -2.5, 3.0, 0.0]), np.array([-7.0, 8.5, 0.0, -1.0])

    def program(p):
        bit = shared(p, bits, frac_bits=0)
        return sec_select(bit, shared(p, a), shared(p, b, 1)).reveal()

    got, _ = run_two_party(program)
    np.testing.assert_array_equal(got, np.where(bits == 1, a, b))


def test_select_by_a_comparison_picks_the_larger():
    a, b = np.array([1.0, -5.0, 2.0]), np.array([0.5, 3.0, 2.0])

    def program(p):
        x, y = shared(p, a), shared(p, b, 1)
        return sec_select(sec_ge(x, y), x, y).reveal()

    got, _ = run_two_party(program)
    np.testing.assert_array_equal(got, np.maximum(a, b))


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 5), st.integers(1, 6), st.integers(1, 4), st.integers(0, 2**31))
def test_sec_matmul_matches_numpy(m, n, k, seed):
    rng = np.random.default_rng(seed)
    x, y = rng.uniform(-10, 10, (m, n)), rng.uniform(-10, 10, (n, k))
    got, _ = run_two_party(lambda p: sec_matmul(shared(p, x), shared(p, y, 1)).reveal())
    bound = (n * 0.5 * (np.abs(x).max() + np.abs(y).max() + 0.5) + 1) * LSB
    assert np.all(np.abs(got - x @ y) <= bound)


def test_sec_inner_matches_numpy_and_costs_one_round():
    rng = np.random.default_rng(1)
    x, y = rng.uniform(-1, 1, (3, 500)), rng.uniform(-1, 1, (3, 500))

    def program(p):
        a, b = shared(p, x), shared(p, y, 1)
        before = p.counters.online.rounds
        z = sec_inner(a, b)
        return z.reveal(), p.counters.online.rounds - before - 1  # minus the reveal

    (got, rounds), _ = run_two_party(program)
    assert rounds == 1
    assert np.all(np.abs(got - np.sum(x * y, axis=1)) <= (500 * 1.0 + 1) * LSB)


def test_sec_square_and_mul3_match_numpy():
    x, y, z = np.array([1.5, -2.0, 0.3]), np.array([2.0, 0.5, -1.1]), np.array([-1.0, 3.0, 2.2])

    def program(p):
        a, b, c = shared(p, x), shared(p, y, 1), shared(p, z)
        return sec_square(a).reveal(), sec_mul3(a, b, c).reveal(), (a * a).reveal()

    (sq, m3, aa), _ = run_two_party(program)
    np.testing.assert_allclose(sq, x * x, atol=4 * LSB)
    np.testing.assert_allclose(aa, sq, atol=2 * LSB)
    np.testing.assert_allclose(m3, x * y * z, atol=12 * LSB)


def test_sec_mul_many_shares_one_round_and_one_dealer_request():
    x, y = np.arange(4.0), np.arange(6.0).reshape(2, 3)

    def program(p):
        a, b = shared(p, x), shared(p, y, 1)
        before = p.counters.snapshot()
        ab, bb = sec_mul_many([a, b], [a, b])
        after = p.counters.snapshot()
        return ab.reveal(), bb.reveal(), before, after

    (ab, bb, before, after), _ = run_two_party(program)
    np.testing.assert_array_equal(ab, x * x)
    np.testing.assert_array_equal(bb, y * y)
    assert after["online"]["rounds"] - before["online"]["rounds"] == 1
    assert after["offline"]["messages"] - before["offline"]["messages"] == 1


def test_sec_mul_byte_and_round_counters_match_the_expected_counts():
    n = 1000
    x = np.linspace(-1, 1, n)

    def program(p):
        a, b = shared(p, x), shared(p, x, 1)
        before = p.counters.snapshot()
        sec_mul(a, b)
        after = p.counters.snapshot()
        return {
            phase: {key: after[phase][key] - before[phase][key] for key in after[phase]}
            for phase in after
        }

    d0, d1 = run_two_party(program)
    # Online: each party sends x - a and y - b (2n words) in one round
    online = {"bytes_sent": 16 * n, "bytes_received": 16 * n, "rounds": 1, "messages": 1}
    assert d0["online"] == online and d1["online"] == online
    # Offline: a seed each; party 1 also gets the correction share c_1 (n words)
    assert d0["offline"] == {"bytes_sent": 0, "bytes_received": 16, "rounds": 0, "messages": 1}
    assert d1["offline"] == {
        "bytes_sent": 0,
        "bytes_received": 16 + 8 * n,
        "rounds": 0,
        "messages": 1,
    }


def test_public_constants_are_rerandomised_so_local_truncation_works_for_negatives():
    # Issue 15: a public constant shared as (c, 0) truncates to a wild value when c < 0
    c = np.array([-3.0, -0.5, 2.0, -1000.0])

    def program(p):
        naive_share = p.fixed_point.encode(c) if p.party_id == 0 else np.zeros(4, np.uint64)
        naive = p.tensor(naive_share).mul_public(0.5).reveal()
        fresh = sec_constant(p, c)
        return naive, fresh.mul_public(0.5).reveal(), fresh.share

    (naive, halved, share0), (_, _, share1) = run_two_party(program)
    assert np.all(np.abs(naive[c < 0] - c[c < 0] / 2) > 1e6)  # the (c, 0) split fails
    np.testing.assert_allclose(halved, c / 2, atol=2 * LSB)  # the re-randomised one does not
    assert not np.any(share1 == 0) and not np.any(share0 == FixedPoint().encode(c))


def test_integer_constants_are_exact():
    got, _ = run_two_party(lambda p: sec_constant(p, np.array([-7, 0, 9]), frac_bits=0).reveal())
    np.testing.assert_array_equal(got, [-7, 0, 9])


def test_a_share_of_an_unexpected_shape_is_refused():
    import pytest

    from fedunlearn.errors import MalformedFrameError

    def program(p):
        return sec_share(p, np.ones(5) if p.party_id == 0 else None, 0, shape=(4,))

    with pytest.raises((MalformedFrameError, ValueError)):
        run_two_party(program, timeout_seconds=5)

    def receiver_checks(p):
        if p.party_id == 0:
            p.transport.send(np.zeros(6, np.uint64))  # not what party 1 was told to expect
            return None
        return sec_share(p, None, 0, shape=(4,))

    with pytest.raises(MalformedFrameError, match="exceed the cap of 32 bytes"):
        run_two_party(receiver_checks, timeout_seconds=5)
    got, _ = run_two_party(
        lambda p: sec_share(p, np.ones(4) if p.party_id == 0 else None, 0, shape=(4,)).reveal()
    )
    np.testing.assert_allclose(got, np.ones(4))
