"""Fixed-point encoding over Z_2^64 and SecureML local truncation (spec §3.1, §3.3 item 6)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedunlearn.errors import ConfigError, SecureComputationError
from fedunlearn.mpc import FixedPoint, check_opened, split_shares, truncate_share

FP = FixedPoint()
finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


def test_default_is_13_fractional_bits_as_in_the_paper():
    assert FP.frac_bits == 13
    assert FP.resolution == 2.0**-13


@pytest.mark.parametrize("bad", [-1, 41, 13.0, "13"])
def test_frac_bits_out_of_range_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="frac_bits"):
        FixedPoint(bad)


@settings(max_examples=60, deadline=None)
@given(st.lists(finite, min_size=1, max_size=20), st.sampled_from([0, 8, 13, 20]))
def test_decode_of_encode_is_within_half_an_lsb(values, frac_bits):
    fp = FixedPoint(frac_bits)
    x = np.array(values)
    assert np.all(np.abs(fp.decode(fp.encode(x)) - x) <= 0.5 * fp.resolution)


def test_negatives_use_twos_complement():
    encoded = FP.encode([-1.0, -FP.resolution, 0.0, 1.0])
    assert encoded.dtype == np.uint64
    assert encoded[0] == np.uint64(2**64 - 2**13)
    assert encoded[1] == np.uint64(2**64 - 1)
    assert encoded[2] == 0 and encoded[3] == 2**13
    np.testing.assert_array_equal(FP.decode(encoded), [-1.0, -FP.resolution, 0.0, 1.0])


def test_values_near_the_range_limit_encode_and_beyond_it_raise():
    near = np.array([FP.max_abs - 1.0, -(FP.max_abs - 1.0)])
    np.testing.assert_array_equal(FP.decode(FP.encode(near)), near)
    with pytest.raises(SecureComputationError, match="cannot encode"):
        FP.encode([FP.max_abs])
    with pytest.raises(SecureComputationError):
        FP.encode([np.nan])


def test_ring_arithmetic_wraps_bit_exactly():
    a = np.array([2**64 - 1, 2**63], dtype=np.uint64)
    b = np.array([1, 2**63], dtype=np.uint64)
    np.testing.assert_array_equal(a + b, [0, 0])
    np.testing.assert_array_equal(a * b, [2**64 - 1, 0])
    minus_one = np.array([2**64 - 1], dtype=np.uint64)  # the integer -1
    assert (FP.encode([3.0]) * minus_one).view(np.int64)[0] == -3 * 2**13


@settings(max_examples=60, deadline=None)
@given(st.lists(finite, min_size=1, max_size=30), st.integers(0, 2**32))
def test_split_shares_reconstruct_exactly(values, seed):
    encoded = FP.encode(values)
    s0, s1 = split_shares(encoded, np.random.default_rng(seed))
    np.testing.assert_array_equal(s0 + s1, encoded)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=50),
    st.integers(0, 2**32),
    st.sampled_from([1, 13, 20]),
)
def test_local_truncation_is_floor_or_floor_plus_one(raw, seed, bits):
    # Prepare: |x| < 2^41, so failure probability <= 2^-22 per element
    x = np.array(raw, dtype=np.int64)
    s0, s1 = split_shares(x.view(np.uint64), np.random.default_rng(seed))
    # Execute
    t = (truncate_share(s0, 0, bits) + truncate_share(s1, 1, bits)).view(np.int64)
    # Assert (SecureML Thm. 1): error at most one LSB
    floor = x >> bits
    assert np.all((t == floor) | (t == floor + 1))


def test_truncation_failure_rate_matches_the_documented_bound():
    # |x| < 2^62: failure probability <= 2^(62 + 1 - 64) = 1/2 per element; it does happen
    rng = np.random.default_rng(0)
    x = rng.integers(2**61, 2**62, size=4000, dtype=np.int64)
    s0, s1 = split_shares(x.view(np.uint64), rng)
    t = (truncate_share(s0, 0, 13) + truncate_share(s1, 1, 13)).view(np.int64)
    failures = np.mean(np.abs(t - (x >> 13)) > 1)
    assert 0.05 < failures <= 0.5 + 0.05
    # |x| < 2^30: bound 2^-33, so none in 4000 draws
    small = rng.integers(-(2**30), 2**30, size=4000, dtype=np.int64)
    s0, s1 = split_shares(small.view(np.uint64), rng)
    t = (truncate_share(s0, 0, 13) + truncate_share(s1, 1, 13)).view(np.int64)
    assert np.all(np.abs(t - (small >> 13)) <= 1)


def test_check_opened_passes_sane_values_and_stops_wild_ones():
    fp = FixedPoint(16)
    sane = np.array([0.5, -2.0, 3.0])
    np.testing.assert_array_equal(check_opened(sane, fp, max_norm=10.0), sane)
    wild = np.array([0.5, 2.0**32, 3.0])  # what a failed truncation at f = 16 looks like
    with pytest.raises(SecureComputationError, match="failed local truncation"):
        check_opened(wild, fp, label="the aggregate of round 3")
    with pytest.raises(SecureComputationError, match="norm 5 above its public bound 4"):
        check_opened(np.array([3.0, 4.0]), fp, max_norm=4.0)
    with pytest.raises(SecureComputationError, match="not finite"):
        check_opened(np.array([np.nan]), fp)


def test_a_failed_truncation_is_caught_by_check_opened():
    # A product -1.0 at scale 2f shared as (x + r, -r) with an unlucky r (party 1's share just
    # below 2^64): SecureML truncation wraps, the rare event with probability ~2^(l + 1 - 64)
    fp = FixedPoint(16)
    x = fp.encode(np.array([-1.0]), 32)
    r = np.array([np.uint64(5)])
    share0, share1 = x + r, np.uint64(0) - r
    product = fp.decode(truncate_share(share0, 0, 16) + truncate_share(share1, 1, 16))
    assert abs(product[0] + 1.0) > 1e9
    with pytest.raises(SecureComputationError, match="failed local truncation"):
        check_opened(product, fp)
