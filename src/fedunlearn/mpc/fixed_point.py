"""Fixed-point encoding over the ring Z_2^64 and SecureML local truncation.

Values are ``numpy.uint64`` arrays; ring arithmetic is numpy's wrap-around arithmetic. A real x is
encoded as round(2^f x) in two's complement, so negatives are the upper half of the ring.

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Sec. VI-A (ABY over Z_2^64, 13 fractional bits), Sec. II-B and App. B-A (fixed-point encoding,
additive sharing), App. B-B item 4 (SecMul truncates); Mohassel and Zhang, "SecureML" (S&P 2017),
Thm. 1 (local truncation). Ring instead of the paper's field, and the truncation rule: MPC1 in
docs/mpc.md.

Truncation error (SecureML, Thm. 1): for a shared x with |x| < 2^l (ring units), truncating each
share locally reconstructs floor(x / 2^f) or floor(x / 2^f) + 1, i.e. the error is at most one
least significant bit, except with probability at most 2^(l + 1 - 64) per element, in which case
the result is off by about 2^(64 - f) (a wild value). With f = 13 and values below 2^20 in
magnitude the failure probability is below 2^-30 per element. Keep 2f + log2(max |product|) < 62.

A failed truncation is far from any sane value: a product truncated by f bits is off by about
2^(64 - 2f) in real units (2^32 at f = 16). ``check_opened`` catches such a value (and NaN,
and anything above a caller's public norm bound) in an opened result before it is used: the
run stops with ``SecureComputationError`` instead of publishing a wild aggregate. Public
constants must never be shared as (c, 0) (see ``protocols.beaver.sec_constant``): local
truncation assumes party 1's share is uniform.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from fedunlearn.errors import ConfigError, SecureComputationError

__all__ = [
    "RING_BITS",
    "FixedPoint",
    "check_opened",
    "random_ring",
    "split_shares",
    "truncate_share",
]

RING_BITS = 64
_U64 = np.uint64


@dataclass(frozen=True)
class FixedPoint:
    """Fixed-point parameters: f fractional bits in Z_2^64.

    Args:
        frac_bits: Number of fractional bits f (p in the paper; 13 in its experiments).
    """

    frac_bits: int = 13

    def __post_init__(self) -> None:
        if not isinstance(self.frac_bits, int) or not 0 <= self.frac_bits <= 40:
            raise ConfigError(
                f"FixedPoint.frac_bits must be an int in [0, 40]; got {self.frac_bits!r}. "
                "The paper uses 13; 16-20 suits small gradients."
            )

    @property
    def max_abs(self) -> float:
        """Largest magnitude that encodes safely: 2^(62 - f), so differences stay below 2^63."""
        return float(2 ** (62 - self.frac_bits))

    @property
    def wild_magnitude(self) -> float:
        """Half the error of a failed local truncation of a product, 2^(63 - 2f).

        No sane opened value reaches it (``check_opened``).
        """
        return float(2.0 ** (63 - 2 * self.frac_bits))

    @property
    def resolution(self) -> float:
        """One least significant bit, 2^-f."""
        return 2.0**-self.frac_bits

    def encode(self, values: ArrayLike, frac_bits: int | None = None) -> NDArray[np.uint64]:
        """Encode reals as round(2^f x) mod 2^64 (two's complement for negatives).

        Args:
            values: Finite reals with |x| < ``max_abs``.
            frac_bits: Scale to encode at; defaults to ``self.frac_bits``.

        Returns:
            A uint64 array of the same shape.

        Raises:
            SecureComputationError: If a value is not finite or too large for the ring (the
                message gives the count and the bound, never a value).
        """
        bits = self.frac_bits if frac_bits is None else frac_bits
        x = np.asarray(values, dtype=np.float64)
        scaled = np.rint(x * 2.0**bits)
        limit = 2.0**62
        if not np.all(np.abs(scaled) < limit):  # also catches NaN
            # the count and the bound only: the values are secret, and the message reaches peers
            bad = int(np.count_nonzero(~(np.abs(scaled) < limit)))
            raise SecureComputationError(
                f"cannot encode {bad} of {x.size} values with {bits} fractional bits: values "
                f"must be finite with |x| < 2^{62 - bits}. Scale the input down or use fewer "
                "fractional bits."
            )
        return scaled.astype(np.int64).view(_U64)

    def decode(self, encoded: ArrayLike, frac_bits: int | None = None) -> NDArray[np.float64]:
        """Decode ring elements read as signed integers: x = int64(v) / 2^f.

        Args:
            encoded: uint64 ring elements.
            frac_bits: Scale they carry; defaults to ``self.frac_bits``.

        Returns:
            float64 array of the same shape.
        """
        bits = self.frac_bits if frac_bits is None else frac_bits
        v = np.asarray(encoded, dtype=_U64)
        return v.view(np.int64).astype(np.float64) / 2.0**bits


def truncate_share(share: NDArray[np.uint64], party_id: int, bits: int) -> NDArray[np.uint64]:
    """Divide a shared value by 2^bits, each party acting on its own share (SecureML).

    Party 0 computes floor(x_0 / 2^bits) reading x_0 as unsigned; party 1 computes
    2^64 - floor((2^64 - x_1) / 2^bits). See the module docstring for the error bound.

    Args:
        share: This party's uint64 share.
        party_id: 0 or 1.
        bits: Number of low bits to drop.

    Returns:
        This party's share of the truncated value.
    """
    if bits == 0:
        return share
    shift = _U64(bits)
    if party_id == 0:
        return np.right_shift(share, shift)
    # SecureML (MPC1): x_1' = 2^64 - floor((2^64 - x_1) / 2^f); ufuncs wrap silently on scalars
    return np.subtract(_U64(0), np.right_shift(np.subtract(_U64(0), share), shift))


def random_ring(generator: np.random.Generator, shape: tuple[int, ...]) -> NDArray[np.uint64]:
    """Draw uniform elements of Z_2^64 from a numpy generator."""
    return generator.integers(0, 2**64 - 1, size=shape, dtype=_U64, endpoint=True)


def split_shares(
    encoded: NDArray[np.uint64], generator: np.random.Generator
) -> tuple[NDArray[np.uint64], NDArray[np.uint64]]:
    """Split ring elements into two additive shares (SecShare by a client, paper Table IV).

    Args:
        encoded: uint64 values v (e.g. ``FixedPoint().encode(gradient)``).
        generator: Source of the uniform mask r.

    Returns:
        (r, v - r): party 0's share and party 1's share.
    """
    v = np.asarray(encoded, dtype=_U64)
    r = random_ring(generator, v.shape)
    return r, v - r


def check_opened(
    values: ArrayLike,
    fixed_point: FixedPoint,
    *,
    max_norm: float | None = None,
    label: str = "an opened value",
) -> NDArray[np.float64]:
    """Sanity-check an opened result before it is used or published.

    Args:
        values: The opened values (e.g. an aggregate both servers just revealed).
        fixed_point: The encoding they came from.
        max_norm: A public bound on their L2 norm (e.g. clip norm times clients), if known.
        label: How the error names them.

    Returns:
        The values, as float64.

    Raises:
        SecureComputationError: A value is not finite, one reaches the magnitude of a failed
            local truncation (``FixedPoint.wild_magnitude``), or the norm exceeds ``max_norm``.
    """
    v = np.asarray(values, dtype=np.float64)
    problem = None
    if not np.all(np.isfinite(v)):
        problem = "is not finite"
    else:
        peak = float(np.max(np.abs(v))) if v.size else 0.0
        norm = float(np.linalg.norm(v))
        if peak >= fixed_point.wild_magnitude:
            problem = (
                f"has an entry of magnitude {peak:.3g} >= {fixed_point.wild_magnitude:.3g}, the "
                "signature of a failed local truncation (a wild value)"
            )
        elif max_norm is not None and norm > max_norm:
            problem = f"has norm {norm:.6g} above its public bound {max_norm:.6g}"
    if problem is not None:
        raise SecureComputationError(
            f"{label} {problem}; it was not used. Re-run the step (the dealer's fresh "
            "randomness makes a repeat failure unlikely) or check that the inputs respect the "
            "fixed-point range."
        )
    return v
