"""Sharing, opening and Beaver multiplication: SecShare, SecRec, SecMul, SecSP, SecMul3, SecSel.

Every multiplication consumes one dealer triple and one round in which each party sends
``x - a`` and ``y - b``. Several products can share one round (``sec_mul_many``), which is how
the comparison, sorting and Newton protocols keep their round counts low.

Paper: Liu et al., Starfish, Table IV and App. B-B items 1-2 (SecShare, SecRec, SecMul, SecSP,
ZeroGen, SecSel); Beaver, "Efficient multiparty protocols using circuit randomization"
(CRYPTO 1991).
No ``refresh``: re-randomising two-party additive shares with a ZeroGen pair (x_0 + r,
x_1 - r) protects nothing, since both servers know r (party 1 holds -r), so it was removed
(issue 25); ZeroGen serves ``sec_constant`` only.
Deviations: [REC] SecMul3 is two sequential SecMuls (2 rounds; MPC5 in docs/mpc.md). [REC]
Selection bits at integer scale and public constants re-randomised (MPC6).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from fedunlearn.errors import MalformedFrameError
from fedunlearn.mpc.fixed_point import truncate_share
from fedunlearn.mpc.party import Party
from fedunlearn.mpc.shares import SharedTensor

__all__ = [
    "sec_aggregate",
    "sec_constant",
    "sec_inner",
    "sec_matmul",
    "sec_mul",
    "sec_mul3",
    "sec_mul_many",
    "sec_reveal",
    "sec_select",
    "sec_share",
    "sec_square",
]

_U64 = np.uint64
U64 = NDArray[np.uint64]


def sec_share(
    party: Party,
    values: ArrayLike | None,
    owner: int,
    frac_bits: int | None = None,
    shape: tuple[int, ...] | None = None,
) -> SharedTensor:
    """SecShare: the owner secret-shares its plaintext with the other party (one message).

    Args:
        party: The calling party.
        values: The plaintext (owner only; the other party passes None).
        owner: Party id of the owner.
        frac_bits: Scale (default f; 0 shares integers exactly).
        shape: The shape both parties know the secret has; the receiving party then refuses
            anything else before reading it (default: any uint64 array within the frame cap).

    Returns:
        This party's share.

    Raises:
        MalformedFrameError: The receiving party got something other than a uint64 array (of
            ``shape``, if given).
    """
    bits = party.fixed_point.frac_bits if frac_bits is None else frac_bits
    if party.party_id != owner:
        cap = None if shape is None else 8 * math.prod(shape)
        mask = party.transport.recv(cap)
        if mask.dtype != np.uint64 or (shape is not None and mask.shape != tuple(shape)):
            expected = f"shape {tuple(shape)}" if shape is not None else "any shape"
            raise MalformedFrameError(
                f"party {owner} shared a {mask.dtype} array of shape {mask.shape}; expected "
                f"uint64 of {expected} (the parties are out of step)"
            )
        return SharedTensor(mask, party, bits)
    if values is None:
        raise ValueError(f"party {owner} owns the secret and must pass its values")
    encoded = party.fixed_point.encode(values, bits)
    if shape is not None and encoded.shape != tuple(shape):
        raise ValueError(f"values have shape {encoded.shape}; the declared shape is {shape}")
    mask = party.prg.ring(encoded.shape)
    party.transport.send(mask)
    return SharedTensor(encoded - mask, party, bits)


def open_ring(x: SharedTensor) -> NDArray[np.uint64]:
    """Open the raw ring elements of ``x`` to both parties (one round)."""
    return x.share + x.party.transport.exchange(x.share)


def sec_reveal(x: SharedTensor) -> NDArray[np.float64]:
    """SecRec: open ``x`` to both parties (one round) and decode it."""
    return x.party.fixed_point.decode(open_ring(x), x.frac_bits)


def sec_aggregate(tensors: Sequence[SharedTensor]) -> SharedTensor:
    """Secure aggregation: the sum of shared tensors is the sum of the shares (local)."""
    total = tensors[0]
    for t in tensors[1:]:
        total = total + t
    return total


def sec_constant(party: Party, values: ArrayLike, frac_bits: int | None = None) -> SharedTensor:
    """Shares of a public constant, re-randomised: (c + r, -r) for a dealer ZeroGen r.

    The obvious split (c, 0) is a valid sharing but a bad one: SecureML local truncation
    (``fixed_point.truncate_share``) assumes party 1's share is uniform, and with (c, 0) a
    negative c truncates to a wild value (about 2^(64 - bits) ring units). Any constant that
    may later be multiplied and truncated locally must come from here.

    Args:
        party: The calling party (both call it with the same values).
        values: The public values (floats are encoded at ``frac_bits``; ints exactly).
        frac_bits: Scale (default f; 0 for integers and bits).

    Returns:
        This party's share of the constant.
    """
    bits = party.fixed_point.frac_bits if frac_bits is None else frac_bits
    v = np.asarray(values)
    if v.dtype.kind in "iub":
        encoded = (v.astype(np.int64) << np.int64(bits)).view(np.uint64)
    else:
        encoded = party.fixed_point.encode(v, bits)
    encoded = np.asarray(encoded, dtype=np.uint64)
    zero = party.dealer.zero(encoded.shape)  # party 0: r, party 1: -r
    share = encoded + zero if party.party_id == 0 else zero
    return SharedTensor(np.asarray(share, dtype=np.uint64), party, bits)


def _finish(z: U64, x: SharedTensor, y: SharedTensor, truncate: bool) -> SharedTensor:
    """Apply the scale rule of ``shares``: truncate by min(f_x, f_y) unless told not to."""
    if not truncate:
        return SharedTensor(z, x.party, x.frac_bits + y.frac_bits)
    bits = min(x.frac_bits, y.frac_bits)
    z = truncate_share(z, x.party.party_id, bits)
    return SharedTensor(z, x.party, max(x.frac_bits, y.frac_bits))


def _flatten(tensors: Sequence[SharedTensor], shapes: list[tuple[int, ...]]) -> NDArray[np.uint64]:
    pairs = zip(tensors, shapes, strict=True)
    return np.concatenate([np.broadcast_to(t.share, s).ravel() for t, s in pairs])


def sec_mul_many(
    xs: Sequence[SharedTensor], ys: Sequence[SharedTensor], truncate: bool = True
) -> list[SharedTensor]:
    """Several elementwise SecMuls (with broadcasting) in one round and one dealer request.

    Args:
        xs: Left operands.
        ys: Right operands, broadcastable against ``xs`` pairwise.
        truncate: Truncate the products back to the larger scale (default), or keep the
            scale f_x + f_y exactly (used before comparisons, so ties stay ties).

    Returns:
        The products, in order.
    """
    party = xs[0].party
    shapes = [np.broadcast_shapes(x.shape, y.shape) for x, y in zip(xs, ys, strict=True)]
    sizes = [math.prod(s) for s in shapes]
    xf, yf = _flatten(xs, shapes), _flatten(ys, shapes)
    n = xf.size
    a, b, c = party.dealer.triple((n,))
    # Beaver: open e = x - a and f = y - b in one round
    mine = np.concatenate([xf - a, yf - b])
    opened = mine + party.transport.exchange(mine)
    e, f = opened[:n], opened[n:]
    z = c + e * b + f * a
    if party.party_id == 0:
        z += e * f
    out, start = [], 0
    for x, y, shape, size in zip(xs, ys, shapes, sizes, strict=True):
        out.append(_finish(z[start : start + size].reshape(shape), x, y, truncate))
        start += size
    return out


def sec_mul(x: SharedTensor, y: SharedTensor, truncate: bool = True) -> SharedTensor:
    """SecMul: elementwise product with a Beaver triple (one round)."""
    return sec_mul_many([x], [y], truncate)[0]


def sec_square(x: SharedTensor) -> SharedTensor:
    """Elementwise square with a square pair (a, a^2): one round, half of SecMul's traffic."""
    party = x.party
    a, c = party.dealer.square_pair((x.size,))
    mine = x.share.reshape(-1) - a
    e = mine + party.transport.exchange(mine)
    # x^2 = (e + a)^2 = c + 2 e a + e^2
    z = c + (e * a << _U64(1))
    if party.party_id == 0:
        z += e * e
    return _finish(z.reshape(x.shape), x, x, True)


def sec_matmul(x: SharedTensor, y: SharedTensor) -> SharedTensor:
    """Matrix SecMul ``x @ y`` with a matrix triple (one round, mn + np elements per party)."""
    party = x.party
    a, b, c = party.dealer.matrix_triple(x.shape, y.shape)
    mine = np.concatenate([(x.share - a).ravel(), (y.share - b).ravel()])
    opened = mine + party.transport.exchange(mine)
    e, f = opened[: x.size].reshape(x.shape), opened[x.size :].reshape(y.shape)
    # Beaver, matrix triple (A, B, C = A B): Z_k = C_k + E B_k + A_k F (+ E F for party 0)
    z = np.add(np.add(c, e @ b), a @ f)
    if party.party_id == 0:
        z = np.add(z, e @ f)
    return _finish(np.asarray(z, dtype=_U64), x, y, True)


def sec_inner(x: SharedTensor, y: SharedTensor) -> SharedTensor:
    """SecSP: inner products over the last axis with a vector triple (one round)."""
    party = x.party
    a, b, c = party.dealer.inner_triple(x.shape)
    mine = np.concatenate([(x.share - a).ravel(), (y.share - b).ravel()])
    opened = mine + party.transport.exchange(mine)
    e, f = opened[: x.size].reshape(x.shape), opened[x.size :].reshape(y.shape)
    # Beaver, vector triple (a, b, c = <a, b>): z = c + <e, b> + <a, f> (+ <e, f> for party 0)
    z = np.add(c, np.sum(e * b + a * f, axis=-1, dtype=_U64))
    if party.party_id == 0:
        z = np.add(z, np.sum(e * f, axis=-1, dtype=_U64))
    return _finish(np.asarray(z, dtype=_U64), x, y, True)


def sec_mul3(x: SharedTensor, y: SharedTensor, z: SharedTensor) -> SharedTensor:
    """SecMul3: x * y * z as two sequential SecMuls (two rounds)."""
    return sec_mul(sec_mul(x, y), z)


def sec_select(bit: SharedTensor, if_true: SharedTensor, if_false: SharedTensor) -> SharedTensor:
    """SecSel: a fresh share of ``if_true`` where bit = 1, else ``if_false`` (one SecMul).

    ``bit`` must hold 0/1 at integer scale (``frac_bits == 0``, as ``sec_ge`` returns), so the
    product needs no truncation and the selection is exact.
    """
    if bit.frac_bits != 0:
        raise ValueError(f"a selection bit must have frac_bits 0; got {bit.frac_bits}")
    return if_false + sec_mul(bit, if_true - if_false)
