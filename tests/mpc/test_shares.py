"""SharedTensor: local operations against numpy, reveal(share(x)) == x (paper App. B-B)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedunlearn.mpc import (
    FixedPoint,
    SharedTensor,
    concatenate,
    run_two_party,
    sec_aggregate,
    sec_share,
    split_shares,
    stack,
)

LSB = 2.0**-13
values = st.lists(
    st.floats(min_value=-1e4, max_value=1e4, allow_nan=False), min_size=1, max_size=12
)


def shared(party, x, owner=0, frac_bits=None):
    return sec_share(party, x if party.party_id == owner else None, owner, frac_bits)


@settings(max_examples=25, deadline=None)
@given(values, st.sampled_from([0, 1]))
def test_reveal_of_share_is_identity(xs, owner):
    x = np.array(xs)
    fp = FixedPoint()
    r0, r1 = run_two_party(lambda p: shared(p, x, owner).reveal(), dealer_seed=1)
    np.testing.assert_array_equal(r0, fp.decode(fp.encode(x)))
    np.testing.assert_array_equal(r0, r1)


def test_reveal_of_share_is_identity_near_the_range_limit_and_at_zero():
    fp = FixedPoint()
    x = np.array([fp.max_abs - 1, -(fp.max_abs - 1), 0.0, -0.0, -fp.resolution])
    r0, _ = run_two_party(lambda p: shared(p, x).reveal())
    np.testing.assert_array_equal(r0, x)


def test_integer_public_matmul_is_exact():
    x = np.array([[1.5, -2.0], [0.25, 3.0]])
    m = np.array([[2, -1], [0, 3]])
    got, _ = run_two_party(lambda p: (shared(p, x) @ m).reveal())
    np.testing.assert_array_equal(got, x @ m)


def test_client_shares_wrap_into_shared_tensors():
    # Prepare: a client splits its gradient for the two servers (SecShare, paper Table IV)
    g = np.array([0.25, -3.5, 1e-3])
    s0, s1 = split_shares(FixedPoint().encode(g), np.random.default_rng(0))
    # Execute
    r0, _ = run_two_party(lambda p: p.tensor((s0, s1)[p.party_id]).reveal())
    # Assert
    np.testing.assert_allclose(r0, g, atol=LSB)


@settings(max_examples=25, deadline=None)
@given(values, st.floats(min_value=-100, max_value=100, allow_nan=False))
def test_local_arithmetic_matches_numpy(xs, c):
    x = np.array(xs)
    y = x[::-1] * 0.5 + 1.0

    def program(p):
        a, b = shared(p, x), shared(p, y, owner=1)
        return [
            (a + b).reveal(),
            (a - b).reveal(),
            (-a).reveal(),
            (a + c).reveal(),
            (c - a).reveal(),
            (a * 3).reveal(),
            (a * c).reveal(),
            (2 * a - b * 0.5).reveal(),
        ]

    got, _ = run_two_party(program, dealer_seed=2)
    expected = [x + y, x - y, -x, x + c, c - x, 3 * x, c * x, 2 * x - 0.5 * y]
    # in LSB: half an LSB per encoded operand, scaled by the other factor, plus one truncation
    tolerances = [1, 1, 0.5, 1, 1, 1.5, 1 + 0.5 * abs(c) + 0.5 * np.abs(x), 3]
    for g, e, tol in zip(got, expected, tolerances, strict=True):
        assert np.all(np.abs(g - e) <= tol * LSB + 1e-12), (g, e)


def test_integer_public_multiplication_is_exact():
    x = np.array([1.5, -2.0, 0.125])
    got, _ = run_two_party(lambda p: (shared(p, x) * np.array([3, -7, 1000])).reveal())
    np.testing.assert_array_equal(got, x * np.array([3, -7, 1000]))


def test_public_matmul_and_local_reshapes_match_numpy():
    rng = np.random.default_rng(0)
    x, m = rng.normal(size=(3, 4)), rng.normal(size=(4, 2))

    def program(p):
        a = shared(p, x)
        return [
            (a @ m).reveal(),
            (m.T @ a.T).reveal(),
            a.sum(axis=0).reveal(),
            a[1:, ::2].reveal(),
            a.reshape(12).reveal(),
            concatenate([a, a]).reveal(),
            stack([a[0], a[1]]).reveal(),
        ]

    got, _ = run_two_party(program)
    expected = [
        x @ m,
        m.T @ x.T,
        x.sum(axis=0),
        x[1:, ::2],
        x.reshape(12),
        np.concatenate([x, x]),
        np.stack([x[0], x[1]]),
    ]
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, atol=8 * LSB)


def test_secure_aggregation_of_client_shares_is_the_sum():
    rng = np.random.default_rng(3)
    updates = rng.normal(size=(5, 100))
    fp = FixedPoint()
    splits = [split_shares(fp.encode(u), rng) for u in updates]

    def program(p):
        return sec_aggregate([p.tensor(s[p.party_id]) for s in splits]).reveal()

    got, _ = run_two_party(program)
    np.testing.assert_array_equal(got, fp.decode(sum(fp.encode(u) for u in updates)))
    np.testing.assert_allclose(got, updates.sum(axis=0), atol=5 * LSB)


def test_mpc_has_no_refresh_that_would_only_pretend_to_re_randomise():
    # issue 25: refresh() added a ZeroGen pair whose r both servers know (party 1 holds -r), so
    # it hid nothing from either server or from a later corruption of the other; removed
    import fedunlearn.mpc as mpc
    import fedunlearn.mpc.protocols as protocols

    assert not hasattr(mpc, "refresh")
    assert not hasattr(protocols, "refresh")


def test_repr_and_conversions_never_show_values():
    x = np.array([123.456, 789.0])

    def program(p):
        a = shared(p, x)
        text = repr(a) + str(a)
        with pytest.raises(TypeError, match="reveal"):
            np.asarray(a)
        with pytest.raises(TypeError, match="truth value"):
            bool(a)
        return text, a.shape

    (text, shape), _ = run_two_party(program)
    assert "123" not in text
    assert "789" not in text
    assert "SharedTensor" in text
    assert shape == (2,)


def test_a_share_must_be_uint64():
    def program(p):
        with pytest.raises(TypeError, match="uint64"):
            SharedTensor(np.zeros(3), p, 13)
        return True

    assert run_two_party(program) == (True, True)
