"""SecMI: inversion of a secret square matrix by masking, X^-1 = R (X R)^-1.

Steps (spec §3.6, with the paper's typo fixed): take a dealer mask [R] (random, invertible);
open N = X R with one matrix SecMul and one SecRec; invert N in the clear (both parties);
return [R] N^-1, a public right-multiplication (local). If N is singular or ill-conditioned
(cond(N) > ``max_condition``) a fresh mask is drawn, up to ``max_attempts`` times.

The public factor N^-1 is encoded with as many fractional bits as fit (at least f): the
product [R] N^-1 is truncated locally, so its public bound m * max|R| * max|N^-1| (in ring
units, at scale f + bits) is kept at ``TARGET_RING_BITS`` = 40, where SecureML truncation fails
with probability at most 2^(40 + 1 - 64) = 2^-23 per element (far less in practice: the bound
is loose). Only when even f bits exceed that (|X^-1| above 2^(40 - 2f) / (m max|R|)) does the
product go higher, exactly as an ordinary SecMul of values that large would. (An earlier
version aimed at 2^48, which fails with probability 2^-15 per element: about one paper-scale
run in 500 returned a wild value.) Accuracy follows the conditioning: relative error about
cond(X) * 2^-f.

Leakage: over a finite field N is uniform and hides X; over fixed-point reals the mask is
only heuristic. The opened N reveals, e.g., the sign of det X relative to det R and the rough
scale of X (masked by R's random 2^s scale). The paper accepts this. The number of attempts
(each opens a fresh N) is public too: a retry tells both servers that X R was ill-conditioned,
i.e. that X is (close to) singular or R was unlucky (docs/security.md).

Paper: Liu et al., Starfish, Alg. 7; Starfish spec §3.6, A15.
Deviations: [FIX] [X^-1] = [R] N^-1 (the paper writes SecMul([R], N)). [REC] the mask comes
from the dealer instead of SecRanGenInv (offline material either way).
"""

from __future__ import annotations

import math

import numpy as np

from fedunlearn.errors import SecureComputationError
from fedunlearn.mpc.protocols.beaver import sec_matmul, sec_reveal
from fedunlearn.mpc.shares import SharedTensor

__all__ = ["TARGET_RING_BITS", "public_bits", "sec_inverse"]

TARGET_RING_BITS = 40


def sec_inverse(x: SharedTensor, max_condition: float = 1e6, max_attempts: int = 4) -> SharedTensor:
    """SecMI: shares of X^-1 for a secret invertible matrix (or stack of matrices) X.

    Args:
        x: Shape (..., m, m), fixed-point scale.
        max_condition: Largest acceptable condition number of the opened N = X R.
        max_attempts: Fresh masks to try before giving up.

    Returns:
        Shares of X^-1 at the scale of ``x``.

    Raises:
        SecureComputationError: If N stays singular or ill-conditioned (X is, too).
    """
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"sec_inverse needs square matrices (..., m, m); got shape {x.shape}")
    party, fp = x.party, x.party.fixed_point
    cond = np.inf
    for _ in range(max_attempts):
        mask = SharedTensor(party.dealer.invertible_mask(x.shape, fp), party, fp.frac_bits)
        opened = sec_reveal(sec_matmul(x, mask))
        cond = float(np.max(np.linalg.cond(opened)))
        if np.isfinite(cond) and cond <= max_condition:
            break
    else:
        raise SecureComputationError(
            f"sec_inverse: the masked matrix N = X R had condition number {cond:.3g} "
            f"(limit {max_condition:g}) in {max_attempts} attempts; X is singular or "
            "ill-conditioned. Regularise X (e.g. add a multiple of the identity)."
        )
    inverse = np.linalg.inv(opened)
    bits = public_bits(inverse, party.dealer.mask_bound(), x.frac_bits)
    return mask.matmul_public(inverse, public_frac_bits=bits)


def public_bits(inverse: np.ndarray, mask_bound: float, frac_bits: int) -> int:
    """Fractional bits for the public N^-1 so that [R] N^-1 stays near 2^TARGET_RING_BITS.

    The product before truncation is bounded by m * mask_bound * max|N^-1| * 2^(f + bits) in
    ring units; ``bits`` is the largest value keeping that at 2^TARGET_RING_BITS, but at least
    f (the precision of every other product) and at most 40.
    """
    m = inverse.shape[-1]
    magnitude = m * mask_bound * max(float(np.max(np.abs(inverse))), 1e-300)
    bits = TARGET_RING_BITS - frac_bits - math.ceil(math.log2(magnitude))
    return int(np.clip(bits, frac_bits, 40))
