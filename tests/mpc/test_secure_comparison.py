"""SecGE (real GMW and ideal), SecGE2/3/4 truth tables and edge cases (spec §3.4, §13 V1)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedunlearn.mpc import (
    FixedPoint,
    ge_cost,
    run_two_party,
    sec_ge,
    sec_ge2,
    sec_ge3,
    sec_ge4,
    sec_share,
)

FP = FixedPoint()
LSB = FP.resolution
EDGE = FP.max_abs - 1.0  # near the fixed-point range: x - y still fits in 63 bits


def shared(party, x, owner=0, frac_bits=None):
    return sec_share(party, x if party.party_id == owner else None, owner, frac_bits)


def run_ge(x, y, comparison="real"):
    def program(p):
        a, b = shared(p, x), shared(p, y, 1)
        before = p.counters.snapshot()
        bit = sec_ge(a, b)
        after = p.counters.snapshot()
        cost = {
            phase: {key: after[phase][key] - before[phase][key] for key in after[phase]}
            for phase in after
        }
        return bit.frac_bits, bit.reveal(), cost

    return run_two_party(program, dealer_seed=4, comparison=comparison)


def test_ge_edge_cases_are_exact():
    # Prepare: equal, zero, negatives, one LSB apart, and the ends of the range
    pairs = [
        (0.0, 0.0),
        (0.0, -0.0),
        (-1.0, -1.0),
        (-1.0, -2.0),
        (-2.0, -1.0),
        (3.5, -3.5),
        (-3.5, 3.5),
        (LSB, 0.0),
        (0.0, LSB),
        (-LSB, 0.0),
        (1.0, 1.0 + LSB),
        (EDGE, -EDGE),
        (-EDGE, EDGE),
        (EDGE, EDGE),
        (-EDGE, -EDGE),
        (EDGE, EDGE - 1),
    ]
    x, y = np.array(pairs).T
    # Execute
    (bits, got, _), (_, other, _) = run_ge(x, y)
    # Assert
    assert bits == 0
    np.testing.assert_array_equal(got, (x >= y).astype(float))
    np.testing.assert_array_equal(got, other)


@settings(max_examples=20, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(-(2**30), 2**30), st.integers(-(2**30), 2**30)),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from([1, 2**13, 2**30]),
)
def test_ge_matches_numpy_on_random_pairs(pairs, scale):
    x, y = (np.array(pairs, dtype=np.float64) / scale).T
    x, y = FP.decode(FP.encode(x)), FP.decode(FP.encode(y))  # compare the encoded values
    (_, got, _), _ = run_ge(x, y)
    np.testing.assert_array_equal(got, (x >= y).astype(float))


def test_ideal_mode_gives_the_same_bits_and_charges_the_same_traffic():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=300), rng.normal(size=300)
    y[:20] = x[:20]  # ties
    real0, real1 = run_ge(x, y, "real")
    ideal0, ideal1 = run_ge(x, y, "ideal")
    np.testing.assert_array_equal(real0[1], ideal0[1])
    np.testing.assert_array_equal(real0[1], (x >= y).astype(float))
    assert real0[2] == ideal0[2] and real1[2] == ideal1[2]


@pytest.mark.parametrize("n", [1, 7, 64, 65, 1001])
def test_ge_cost_formula_matches_measured_traffic(n):
    x = np.linspace(-5, 5, n)
    (_, _, cost0), (_, _, cost1) = run_ge(x, x[::-1])
    assert cost0 == ge_cost(n, 0)
    assert cost1 == ge_cost(n, 1)
    assert cost0["online"]["rounds"] == 8


@pytest.mark.parametrize("n", [1, 2, 7, 64, 65, 1001, 6400])
def test_carry_tree_never_sends_more_than_the_full_adder(n):
    # the word-level Kogge-Stone adder this replaced sent 152 bytes + 1 bit per comparison
    sent = ge_cost(n, 0)["online"]["bytes_sent"] - -(-n // 8)
    assert sent <= 152 * n
    if n == 1:
        assert sent == 152
    if n % 64 == 0:
        assert sent == 39.5 * n  # 16 + 24 (1/2 + ... + 1/32) + 16 / 64 bytes per comparison


def test_tree_comparison_is_exact_on_edge_cases_in_a_large_batch():
    # Prepare: a batch that is not a multiple of 64 (padded word slots) with edge cases
    rng = np.random.default_rng(2)
    n = 3001
    x, y = rng.normal(size=n) * 100, rng.normal(size=n) * 100
    x[:40] = y[:40]  # equal
    x[40:60], y[40:60] = 2.0**47, -(2.0**47)  # near the encodable limit
    x[60:80], y[60:80] = -(2.0**48), 2.0**48 - 1
    x[80:100], y[80:100] = LSB, 0.0  # one LSB apart
    x[-1], y[-1] = 0.0, LSB  # the last value sits in a padded word

    # Execute
    (_, bits, cost), _ = run_ge(x, y)

    # Assert
    np.testing.assert_array_equal(bits, (x >= y).astype(float))
    assert cost["online"]["bytes_sent"] == ge_cost(n, 0)["online"]["bytes_sent"] < 40 * n


def test_ge2_compares_ratios_exactly_including_ties():
    u_i = np.array([1.0, 2.0, -1.0, 3.0, 0.0, 1.0])
    v_i = np.array([2.0, 4.0, 1.0, 7.0, 5.0, 3.0])
    u_j = np.array([2.0, 1.0, -1.5, 3.0, 0.0, 0.3333])
    v_j = np.array([4.0, 2.0, 2.0, 7.001, 1.0, 1.0])

    def program(p):
        return sec_ge2(shared(p, u_i), shared(p, v_i), shared(p, u_j, 1), shared(p, v_j, 1))

    got, _ = run_two_party(lambda p: program(p).reveal())
    enc = [FP.decode(FP.encode(a)) for a in (u_i, v_i, u_j, v_j)]
    expected = (enc[0] * enc[3] >= enc[2] * enc[1]).astype(float)
    np.testing.assert_array_equal(got, expected)
    assert got[0] == 1 and got[1] == 1 and got[4] == 1  # exact ties compare as >=


def signed(w, b):
    return np.where(w == 1, 1.0, -1.0) * np.sqrt(b)


def truth_table():
    """All sign combinations with equal and unequal magnitudes (b = 0 only with w = 1)."""
    rows = []
    for w_i, w_j, b_i, b_j in itertools.product([0, 1], [0, 1], [0.0, 0.25, 0.5], [0.25, 0.5]):
        if b_i == 0.0 and w_i == 0:
            continue
        rows.append((w_i, w_j, b_i, b_j))
    return np.array(rows).T


def test_ge3_truth_table():
    w_i, w_j, b_i, b_j = truth_table()

    def program(p):
        return sec_ge3(
            shared(p, w_i, frac_bits=0), shared(p, b_i), shared(p, w_j, 1, 0), shared(p, b_j, 1)
        ).reveal()

    got, _ = run_two_party(program)
    np.testing.assert_array_equal(got, (signed(w_i, b_i) >= signed(w_j, b_j)).astype(float))


def test_ge4_matches_ge3_on_the_same_cosines():
    w_i, w_j, b_i, b_j = truth_table()
    v_i, v_j = np.full_like(b_i, 4.0), np.full_like(b_j, 2.0)
    a_i, a_j = b_i * v_i, b_j * v_j  # a = u^2, v = ||x||^2 ||y||^2, b = a / v

    def program(p):
        return sec_ge4(
            shared(p, w_i, frac_bits=0),
            shared(p, a_i),
            shared(p, v_i),
            shared(p, w_j, 1, 0),
            shared(p, a_j, 1),
            shared(p, v_j, 1),
        ).reveal()

    got, _ = run_two_party(program)
    np.testing.assert_array_equal(got, (signed(w_i, b_i) >= signed(w_j, b_j)).astype(float))


def test_ge_broadcasts_and_keeps_shapes():
    x = np.array([[1.0, -1.0], [0.0, 2.0]])

    def program(p):
        return sec_ge(shared(p, x), shared(p, np.array([0.0, 1.0]), 1)).reveal()

    got, _ = run_two_party(program)
    np.testing.assert_array_equal(got, (x >= np.array([0.0, 1.0])).astype(float))


def test_ge_against_a_public_value_matches_plain_comparison():
    x = np.array([-2.0, 1.5 - LSB, 1.5, 1.5 + LSB, 7.0])

    got, _ = run_two_party(lambda p: sec_ge(shared(p, x), 1.5).reveal())

    np.testing.assert_array_equal(got, (x >= 1.5).astype(float))


def test_ideal_comparisons_are_refused_outside_the_in_process_transport():
    # Issue 15: comparison=ideal ran in the deployment; each server then saw d = x - y
    import socket

    from fedunlearn.errors import ConfigError
    from fedunlearn.mpc import Party, TcpTransport

    a, b = socket.socketpair()
    t0, t1 = TcpTransport(a, 0, 5.0), TcpTransport(b, 1, 5.0)
    try:
        with pytest.raises(ConfigError, match="refused on TcpTransport"):
            Party(0, t0, dealer_seed=1, comparison="ideal")
        party = Party(0, t0, dealer_seed=1)  # real comparisons are fine
        x = party.tensor(np.zeros(3, np.uint64))
        with pytest.raises(ConfigError, match="comparison='real'"):
            sec_ge(x, 0.0, mode="ideal")
        with pytest.raises(ConfigError, match="ideal functionalities"):
            t1.exchange_uncounted(np.zeros(1, np.uint64))
    finally:
        t0.close()
        t1.close()
