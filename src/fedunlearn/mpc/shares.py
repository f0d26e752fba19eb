"""``SharedTensor``: one party's additive share of a secret array, with tensor-like operators.

A ``SharedTensor`` holds this party's uint64 share, its ``Party`` and its scale (``frac_bits``:
f for fixed-point reals, 0 for integers and bits). Local operations (add, subtract, negate,
public multiply, indexing, reshape, sum) need no messages; ``x * y`` and ``x @ y`` with two
shared operands run Beaver protocols. ``reveal()`` is the only way to open a value, and the
repr never shows share values. Numpy refuses to convert a ``SharedTensor`` (``__array__``
raises), so shares cannot leak into plaintext code by accident.

Scales: a product of scales f_x and f_y has scale f_x + f_y; it is truncated by min(f_x, f_y)
to scale max(f_x, f_y). So bit * real needs no truncation and real * real loses <= 1 LSB
(``fixed_point`` module docstring). Integer public operands are exact; float ones are encoded
at f bits.

Paper: Liu et al., Starfish, Sec. II-B (additive sharing), App. B-B item 1 (SecAdd, and local
SecAdd/SecMul with a public operand); scales: MPC6 in docs/mpc.md. The API follows CrypTen's
``MPCTensor`` (Knott et al., "CrypTen", NeurIPS 2021).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from fedunlearn.mpc.fixed_point import truncate_share

if TYPE_CHECKING:
    from fedunlearn.mpc.party import Party

__all__ = ["SharedTensor", "concatenate", "stack"]

_U64 = np.uint64


def _is_integer(value: np.ndarray) -> bool:
    return value.dtype.kind in "iub"


class SharedTensor:
    """This party's share of a secret array over Z_2^64.

    Args:
        share: uint64 array, this party's additive share.
        party: The owning party (transport, dealer, fixed-point parameters).
        frac_bits: Scale of the secret: value = ring element / 2^frac_bits.
    """

    __slots__ = ("frac_bits", "party", "share")
    __array_ufunc__ = None  # numpy defers to our reflected operators: array * shared works

    def __init__(self, share: NDArray[np.uint64], party: Party, frac_bits: int) -> None:
        if isinstance(share, np.generic):  # indexing a 1-d share gives a numpy scalar
            share = np.asarray(share)
        if not isinstance(share, np.ndarray) or share.dtype != _U64:
            raise TypeError(f"a share must be a numpy uint64 array; got {type(share).__name__}")
        self.share = share
        self.party = party
        self.frac_bits = int(frac_bits)

    # ----- shape and representation ---------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the secret array."""
        return self.share.shape

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return self.share.ndim

    @property
    def size(self) -> int:
        """Number of elements."""
        return self.share.size

    def __len__(self) -> int:
        return len(self.share)

    def __repr__(self) -> str:
        return (
            f"SharedTensor(shape={self.shape}, frac_bits={self.frac_bits}, "
            f"party={self.party.party_id})"
        )

    def __bool__(self) -> bool:
        raise TypeError("a SharedTensor has no truth value; compare with sec_ge and reveal()")

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError("a SharedTensor cannot become a numpy array; call reveal() to open it")

    def _new(self, share: NDArray[np.uint64], frac_bits: int | None = None) -> SharedTensor:
        return SharedTensor(share, self.party, self.frac_bits if frac_bits is None else frac_bits)

    def __getitem__(self, index: Any) -> SharedTensor:
        return self._new(self.share[index])

    def reshape(self, *shape: int) -> SharedTensor:
        """Return the same secret with a new shape."""
        return self._new(self.share.reshape(*shape))

    def flatten(self) -> SharedTensor:
        """Return a 1-d copy."""
        return self._new(self.share.reshape(-1).copy())

    def transpose(self, *axes: int) -> SharedTensor:
        """Permute axes (reverse them by default)."""
        return self._new(self.share.transpose(*axes) if axes else self.share.T)

    @property
    def T(self) -> SharedTensor:  # noqa: N802 (numpy's name)
        """Transpose."""
        return self.transpose()

    def sum(self, axis: int | tuple[int, ...] | None = None) -> SharedTensor:
        """Sum over ``axis`` (local: the sum of shares is a share of the sum)."""
        return self._new(np.asarray(np.sum(self.share, axis=axis, dtype=_U64)))

    # ----- scale ----------------------------------------------------------------------------
    def rescale(self, frac_bits: int) -> SharedTensor:
        """Return the secret at another scale: exact upwards, local truncation downwards."""
        if frac_bits >= self.frac_bits:
            return self._new(self.share << _U64(frac_bits - self.frac_bits), frac_bits)
        bits = self.frac_bits - frac_bits
        return self._new(truncate_share(self.share, self.party.party_id, bits), frac_bits)

    def _public(self, value: ArrayLike, frac_bits: int) -> NDArray[np.uint64]:
        v = np.asarray(value)
        if _is_integer(v):
            return (v.astype(np.int64) << np.int64(frac_bits)).view(_U64)
        return self.party.fixed_point.encode(v, frac_bits)

    # ----- local arithmetic -----------------------------------------------------------------
    def __add__(self, other: SharedTensor | ArrayLike) -> SharedTensor:
        if isinstance(other, SharedTensor):
            frac = max(self.frac_bits, other.frac_bits)
            return self._new(self.rescale(frac).share + other.rescale(frac).share, frac)
        if self.party.party_id == 1:
            shape = np.broadcast_shapes(self.shape, np.shape(other))
            return self._new(np.broadcast_to(self.share, shape).copy())
        return self._new(self.share + self._public(other, self.frac_bits))

    __radd__ = __add__

    def __neg__(self) -> SharedTensor:
        return self._new(_U64(0) - self.share)

    def __sub__(self, other: SharedTensor | ArrayLike) -> SharedTensor:
        if isinstance(other, SharedTensor):
            return self + (-other)
        return self + np.negative(np.asarray(other))

    def __rsub__(self, other: ArrayLike) -> SharedTensor:
        return (-self) + other

    def mul_public(self, value: ArrayLike, public_frac_bits: int | None = None) -> SharedTensor:
        """Multiply by a public array (local; paper App. B-B item 1).

        Integer values multiply exactly. Float values are encoded at ``public_frac_bits``
        (default f) and the product truncated back to this tensor's scale; an integer-scale
        tensor (bits) instead takes the public operand's scale, with no truncation.
        """
        v = np.asarray(value)
        if _is_integer(v):
            return self._new(self.share * v.astype(np.int64).view(_U64))
        bits = self.party.fixed_point.frac_bits if public_frac_bits is None else public_frac_bits
        product = self.share * self.party.fixed_point.encode(v, bits)
        if self.frac_bits == 0:
            return self._new(product, bits)
        return self._new(truncate_share(product, self.party.party_id, bits))

    def matmul_public(
        self, matrix: ArrayLike, *, left: bool = False, public_frac_bits: int | None = None
    ) -> SharedTensor:
        """Return self @ matrix (or matrix @ self with ``left=True``) for a public matrix (local).

        Integer matrices multiply exactly; float ones follow ``mul_public``'s scale rule.
        """
        m = np.asarray(matrix)
        if _is_integer(m):  # exact, no truncation
            ints = m.astype(np.int64).view(_U64)
            return self._new(np.asarray(ints @ self.share if left else self.share @ ints))
        bits = self.party.fixed_point.frac_bits if public_frac_bits is None else public_frac_bits
        encoded = self.party.fixed_point.encode(m, bits)
        product = encoded @ self.share if left else self.share @ encoded
        product = np.asarray(product, dtype=_U64)
        if self.frac_bits == 0:
            return self._new(product, bits)
        return self._new(truncate_share(product, self.party.party_id, bits))

    # ----- operators that may communicate ---------------------------------------------------
    def __mul__(self, other: SharedTensor | ArrayLike) -> SharedTensor:
        if isinstance(other, SharedTensor):
            from fedunlearn.mpc.protocols.beaver import sec_mul  # beaver imports this module

            return sec_mul(self, other)
        return self.mul_public(other)

    __rmul__ = __mul__

    def __matmul__(self, other: SharedTensor | ArrayLike) -> SharedTensor:
        if isinstance(other, SharedTensor):
            from fedunlearn.mpc.protocols.beaver import sec_matmul

            return sec_matmul(self, other)
        return self.matmul_public(other)

    def __rmatmul__(self, other: ArrayLike) -> SharedTensor:
        return self.matmul_public(other, left=True)

    def reveal(self) -> NDArray[np.float64]:
        """Open the secret to both parties (SecRec: one round); returns float64 values."""
        from fedunlearn.mpc.protocols.beaver import sec_reveal

        return sec_reveal(self)


def concatenate(tensors: Sequence[SharedTensor], axis: int = 0) -> SharedTensor:
    """Concatenate shared tensors of one party and one scale (local)."""
    first = tensors[0]
    frac = max(t.frac_bits for t in tensors)
    shares = [t.rescale(frac).share for t in tensors]
    return SharedTensor(np.concatenate(shares, axis=axis), first.party, frac)


def stack(tensors: Sequence[SharedTensor], axis: int = 0) -> SharedTensor:
    """Stack shared tensors along a new axis (local)."""
    first = tensors[0]
    frac = max(t.frac_bits for t in tensors)
    shares = [t.rescale(frac).share for t in tensors]
    return SharedTensor(np.stack(shares, axis=axis), first.party, frac)
