"""PlainBackend, the plaintext mirror, against numpy: every op, the opening log, top_k orders."""

import inspect

import numpy as np
import pytest
import torch

from fedunlearn.unlearn.starfish.backend.plain import PlainBackend
from fedunlearn.unlearn.starfish.backend.protocol import (
    SingularMatrixError,
    StarfishBackend,
    bitonic_comparators,
)


def test_plain_backend_implements_the_protocol_with_the_same_signatures():
    backend = PlainBackend()
    assert isinstance(backend, StarfishBackend)
    ops = [n for n, f in vars(StarfishBackend).items() if callable(f) and not n.startswith("_")]
    assert len(ops) == 27
    for name in ops:
        wanted = list(inspect.signature(getattr(StarfishBackend, name)).parameters)
        assert list(inspect.signature(getattr(PlainBackend, name)).parameters) == wanted, name


def test_plain_backend_ops_match_numpy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(4, 5)), rng.normal(size=(4, 5))
    sq = rng.normal(size=(3, 3)) + 3 * np.eye(3)
    be = PlainBackend()
    sa, sb = be.share(torch.tensor(a)), be.share(torch.tensor(b))

    def open_(x):
        return be.reveal(x, "test").numpy()

    np.testing.assert_allclose(open_(be.add(sa, sb)), a + b)
    np.testing.assert_allclose(open_(be.sub(sa, sb)), a - b)
    np.testing.assert_allclose(open_(be.add_public(sa, torch.tensor(b))), a + b)
    np.testing.assert_allclose(open_(be.mul_public(sa, 2.5)), 2.5 * a)
    np.testing.assert_allclose(open_(be.matmul_public(torch.tensor(b.T), sa)), b.T @ a)
    np.testing.assert_allclose(open_(be.sum(sa)), a.sum(-1))
    np.testing.assert_allclose(open_(be.stack([sa, sb], dim=1)), np.stack([a, b], 1))
    np.testing.assert_allclose(open_(be.concat([sa, sb])), np.concatenate([a, b]))
    np.testing.assert_allclose(open_(be.index(sa, (slice(1, 3), 2))), a[1:3, 2])
    np.testing.assert_allclose(open_(be.transpose(sa)), a.T)
    w = np.array([0.2, 0.3, 0.1, 0.4])
    np.testing.assert_allclose(
        open_(be.weighted_sum([be.index(sa, i) for i in range(4)], torch.tensor(w))), w @ a
    )
    np.testing.assert_allclose(open_(be.mul(sa, sb)), a * b)
    np.testing.assert_allclose(open_(be.matmul(sa, be.transpose(sb))), a @ b.T)
    np.testing.assert_allclose(open_(be.dot(sa, sb)), (a * b).sum(-1))
    bits = be.ge(sa, sb)
    np.testing.assert_array_equal(open_(bits), (a >= b).astype(float))
    np.testing.assert_array_equal(open_(be.ge(sa, 0.0)), (a >= 0).astype(float))
    np.testing.assert_allclose(open_(be.select(bits, sa, sb)), np.maximum(a, b))
    np.testing.assert_allclose(open_(be.max(sa)), a.max(-1))
    assert float(open_(be.kth_largest(sa, 3))) == np.sort(a.ravel())[::-1][2]
    np.testing.assert_allclose(open_(be.div(sa, sb)), a / b)
    np.testing.assert_allclose(open_(be.sqrt(be.mul(sa, sa))), np.abs(a))
    np.testing.assert_allclose(open_(be.inverse(be.share(torch.tensor(sq)))), np.linalg.inv(sq))


def test_reveal_is_the_only_opening_and_is_logged_with_its_phase():
    be = PlainBackend()
    secret = be.share(torch.arange(3.0))
    assert "0." not in repr(secret)
    assert "shape=(3,)" in repr(secret)
    with be.phase("TC"):
        be.reveal(secret, "correction_flags")
        be.reveal(be.share(torch.zeros(100)), "aggregate")
    first, second = (o.to_dict() for o in be.opened)
    assert first == {
        "phase": "TC",
        "label": "correction_flags",
        "shape": [3],
        "value": [0.0, 1.0, 2.0],
    }
    assert second["label"] == "aggregate"
    assert second["value"] is None  # large: shape only
    assert be.op_counts["TC"]["reveal"]["calls"] == 2


def test_inverse_of_a_singular_matrix_raises():
    be = PlainBackend()
    with pytest.raises(SingularMatrixError):
        be.inverse(be.share(torch.ones(2, 2)))


@pytest.mark.parametrize("seed", range(5))
def test_every_top_k_order_ranks_like_the_numpy_cosine(seed):
    rng = np.random.default_rng(seed)
    n, m, k = 9, 20, 5
    g = rng.normal(size=(n, m))
    y = rng.normal(size=(n, m)) + 0.5 * g * rng.normal(size=(n, 1))
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    u = (g * y).sum(1)
    norm = np.linalg.norm(g, axis=1)
    expected = list(np.argsort(-(u / norm))[:k])
    be = PlainBackend()
    su, sn = be.share(torch.tensor(u)), be.share(torch.tensor(norm))
    sv2 = be.share(torch.tensor(norm**2))
    signed = {"w": be.ge(su, 0.0), "a": be.mul(su, su), "v": sv2}
    assert be.top_k({"u": su, "v": sn}, "ratio", k, "t") == expected
    assert be.top_k({"tau": be.div(su, sn)}, "value", k, "t") == expected
    assert be.top_k(signed, "signed_ratio", k, "t") == expected
    b = be.div(signed["a"], sv2)
    assert be.top_k({"w": signed["w"], "b": b}, "signed_value", k, "t") == expected
    assert be.op_counts["setup"]["top_k"]["comparisons"] == 4 * bitonic_comparators(9)
