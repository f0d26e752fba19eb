"""SecMI: inversion of a secret square matrix by masking, X^-1 = R (X R)^-1.

Steps (spec §3.6, with the paper's typo fixed): take a dealer mask [R] (random, invertible);
open N = X R with one matrix SecMul and one SecRec; invert N in the clear (both parties);
return [R] N^-1, a public right-multiplication (local). If N is singular or ill-conditioned
(cond(N) > ``max_condition``) a fresh mask is drawn, up to ``max_attempts`` times.

The public factor N^-1 is encoded with as many fractional bits as fit (at least f): the public
bound m * max|R| * max|N^-1| on |X^-1| is kept near 2^48 in ring units, so local truncation
fails with probability at most about 2^-15 per element (far less in practice: the bound is
loose). Accuracy then follows the conditioning: relative error about cond(X) * 2^-f.

Leakage (spec A15, A26): over a finite field N is uniform and hides X; over fixed-point reals
the mask is only heuristic. The opened N reveals, e.g., the sign of det X relative to det R and
the rough scale of X (masked by R's random 2^s scale). The paper accepts this.

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

__all__ = ["sec_inverse"]

_TARGET_RING_BITS = 48


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
    m = x.shape[-1]
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
    magnitude = m * party.dealer.mask_bound() * max(float(np.max(np.abs(inverse))), 1e-300)
    bits = _TARGET_RING_BITS - x.frac_bits - math.ceil(math.log2(magnitude))
    bits = int(np.clip(bits, x.frac_bits, 40))
    return mask.matmul_public(inverse, public_frac_bits=bits)
