"""SecMax (tournament) and SecSrt (bitonic, payload, padding) against numpy (MPC9, docs/mpc.md)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fedunlearn.mpc import FixedPoint, run_two_party, sec_ge2, sec_max, sec_share, sec_sort

FP = FixedPoint()


def shared(party, x, owner=0, frac_bits=None):
    return sec_share(party, x if party.party_id == owner else None, owner, frac_bits)


def quantised(x):
    return FP.decode(FP.encode(x))


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(-50, 50), min_size=1, max_size=19))
def test_sort_matches_argsort_with_payload_indices(keys):
    # Prepare: small integer keys give many ties; the payload is the shared original index
    x = np.array(keys, dtype=np.float64) / 4
    index = np.arange(len(x))

    def program(p):
        key, idx = shared(p, x), shared(p, index, frac_bits=0)
        before = p.counters.online.rounds
        ranked, ranked_idx = sec_sort([key, idx])
        rounds = p.counters.online.rounds - before
        return ranked.reveal(), ranked_idx.reveal().astype(int), rounds

    # Execute
    (ranked, ranked_idx, rounds), _ = run_two_party(program)
    # Assert: descending keys, and every payload still sits next to its own key
    np.testing.assert_array_equal(ranked, np.sort(x)[::-1])
    np.testing.assert_array_equal(np.sort(ranked_idx), index)
    np.testing.assert_array_equal(x[ranked_idx], ranked)
    levels = math.ceil(math.log2(len(x))) if len(x) > 1 else 0
    assert rounds == 9 * levels * (levels + 1) // 2  # one SecGE (8) + one SecSel per layer


def test_sort_ascending_and_power_of_two_sizes():
    x = np.array([3.0, -1.0, 2.5, 0.0, -7.25, 8.0, 1.0, 1.0])

    def program(p):
        return sec_sort([shared(p, x)], descending=False)[0].reveal()

    got, _ = run_two_party(program)
    np.testing.assert_array_equal(got, np.sort(x))


def test_sort_by_ratio_with_the_ge2_comparator():
    # Starfish Method 1: rank rounds by u / v without division, carrying the round index
    u = np.array([0.5, -0.2, 0.9, 0.1, 0.3])
    v = np.array([1.0, 0.5, 3.0, 0.2, 0.4])

    def program(p):
        fields = [shared(p, u), shared(p, v), shared(p, np.arange(5), frac_bits=0)]
        out = sec_sort(
            fields,
            comparator=lambda a, b: sec_ge2(a[0], a[1], b[0], b[1]),
            padding=[-(1 << 40), 1 << 13, 0],  # u = -2^27, v = 1: below every ratio
        )
        return out[2].reveal().astype(int)

    got, _ = run_two_party(program)
    np.testing.assert_array_equal(got, np.argsort(-(quantised(u) / quantised(v))))


def test_max_returns_the_winner_and_its_payload_per_column():
    # Prepare: T = 5 rounds (rows) of thresholds for 3 clients (columns), with a tie
    delta = np.array(
        [
            [0.1, 2.0, -1.0],
            [0.7, 2.0, -3.0],
            [0.3, 1.0, -0.5],
            [0.7, 0.5, -2.0],
            [0.2, 1.5, -0.75],
        ]
    )
    rounds = np.tile(np.arange(5)[:, None], (1, 3))

    def program(p):
        best, arg = sec_max([shared(p, delta), shared(p, rounds, frac_bits=0)])
        return best.reveal(), arg.reveal().astype(int), p.counters.online.rounds

    (best, arg, _), _ = run_two_party(program)
    np.testing.assert_array_equal(best, quantised(delta).max(axis=0))
    np.testing.assert_array_equal(delta[arg, np.arange(3)], delta.max(axis=0))


@settings(max_examples=15, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=21))
def test_max_matches_numpy(values):
    x = quantised(np.array(values))
    got, _ = run_two_party(lambda p: sec_max([shared(p, x)])[0].reveal())
    assert got == x.max()


def test_max_of_one_entry_costs_nothing():
    def program(p):
        before = p.counters.online.rounds
        best = sec_max([shared(p, np.array([4.5]))])[0]
        return p.counters.online.rounds - before, best.reveal()

    (rounds, best), _ = run_two_party(program)
    assert rounds == 1
    assert best == 4.5  # only the sharing message
