"""Division and square root by Newton iteration over a public input range.

Both protocols first scale the secret by the public constant c = sqrt(lo * hi), so the scaled
input lies in [1/rho, rho] with rho = sqrt(hi / lo), which balances the fixed-point precision
of the input and of its reciprocal. The starting point is public, which makes the first
iteration local; the number of iterations is computed in the clear from the worst case of the
range (until the relative error is below 2^-(f + 2)), so both parties run the same count and
nothing about the secret is revealed.

- Reciprocal: y <- y (2 - v y), from y_0 = 1/rho; 2 rounds per iteration.
- Inverse square root: y <- y (3 - x y^2) / 2, from y_0 = rho^(-1/2); 3 rounds per iteration.
  sqrt(x) = x y (MPC7 in docs/mpc.md); used only for the 2PC-FedRecover comparison (Fig. 7).

Accuracy is that of f-bit fixed point: relative error of a few 2^-f times rho in the worst
case (tests assert the bounds for their ranges). Inputs outside the declared range would give
wrong results (a reciprocal diverges), so by default each call first checks the range securely
(``sec_check_range``): 2n comparisons x >= lo and hi >= x, their count, one more comparison
[count = 2n], and only that bit is opened (one bit per call, "every input is in range"; the
comparison bits and the count stay shared). A 0 raises ``SecureComputationError`` at both
parties instead of returning garbage. ``check_range=False`` skips it where the range is proven
from public data (e.g. bounds on norms that are public anyway).

Paper: Liu et al., Starfish, App. B-B item 6 and Tables V-VI (SecDiv), Sec. IV-A2 (Method 2
divides), Sec. VI-B2 and Fig. 7 (secure sqrt).
Deviations: [REC] SecDiv is Newton-Raphson with a public range instead of a Yao division
circuit, and returns the fixed-point quotient u / v, not the integer floor(u / v) (MPC7 in
docs/mpc.md; SF11 in docs/methods/starfish.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from fedunlearn.errors import ConfigError, SecureComputationError
from fedunlearn.mpc.protocols.beaver import open_ring, sec_mul
from fedunlearn.mpc.protocols.compare import sec_ge
from fedunlearn.mpc.shares import SharedTensor, concatenate

__all__ = ["newton_iterations", "sec_check_range", "sec_div", "sec_reciprocal", "sec_sqrt"]


def _check_range(name: str, value_range: tuple[float, float]) -> tuple[float, float]:
    lo, hi = (float(v) for v in value_range)
    if not 0 < lo <= hi < math.inf:
        raise ConfigError(
            f"{name} must be a public range (lo, hi) with 0 < lo <= hi < inf; got {value_range!r}"
        )
    return lo, hi


def sec_check_range(x: SharedTensor, value_range: tuple[float, float], what: str) -> None:
    """Check securely that every entry of ``x`` lies in ``value_range``; open only that bit.

    Compares x >= lo and hi >= x for all entries (one SecGE call, 2n comparisons), sums the
    bits (local), compares the sum with 2n (one more SecGE) and opens that single bit.

    Args:
        x: The secret input.
        value_range: The public range (lo, hi) it must lie in (bounds inclusive up to one LSB).
        what: How the error names the caller (``sec_div``, ``sec_sqrt``).

    Raises:
        SecureComputationError: Some entry is out of range (which one stays secret).
    """
    lo, hi = value_range
    if x.size == 0:
        return
    flat = x.flatten()
    both = sec_ge(concatenate([flat - lo, -flat + hi]), 0.0)  # 0/1 at integer scale
    count = both.sum()
    all_in = sec_ge(count, np.int64(2 * x.size))
    bit = int(open_ring(all_in)) & 1
    if bit != 1:
        raise SecureComputationError(
            f"{what}: at least one of {x.size} secret inputs lies outside the declared range "
            f"[{lo:g}, {hi:g}] (checked securely; only this one bit was opened). Newton's method "
            "would return garbage there. Declare a range that holds (e.g. from public bounds "
            "on norms), or scale the inputs."
        )


def newton_iterations(step: Callable[[float], float], start: float, frac_bits: int) -> int:
    """Count the iterations of ``t <- step(t)`` from ``start`` until |1 - t| < 2^-(f + 2)."""
    t, count = start, 0
    while abs(1.0 - t) >= 2.0 ** -(frac_bits + 2) and count < 200:
        t, count = step(t), count + 1
    return count


def _centred(
    x: SharedTensor, name: str, x_range: tuple[float, float], check_range: bool, what: str
) -> tuple[SharedTensor, float, float]:
    """Return x / scale (in [1/rho, rho]), scale = sqrt(lo hi) and rho = sqrt(hi / lo).

    Checks ``x_range`` (named ``name``), and with ``check_range`` that every x lies in it.
    """
    lo, hi = _check_range(name, x_range)
    if check_range:
        sec_check_range(x, (lo, hi), what)
    scale, rho = math.sqrt(lo * hi), math.sqrt(hi / lo)
    return x.mul_public(1.0 / scale), scale, rho


def sec_reciprocal(
    v: SharedTensor, v_range: tuple[float, float], *, check_range: bool = True
) -> SharedTensor:
    """Shares of 1 / v for a secret v in the public range ``v_range``.

    Raises:
        SecureComputationError: With ``check_range``, if some v lies outside ``v_range``.
    """
    scaled, scale, rho = _centred(v, "v_range", v_range, check_range, "sec_reciprocal")
    f = v.party.fixed_point.frac_bits
    # t = scaled * y: t <- t (2 - t), worst start 1/rho^2
    iterations = newton_iterations(lambda t: t * (2.0 - t), 1.0 / rho**2, f)
    y0 = 1.0 / rho
    y = (2.0 - scaled.mul_public(y0)).mul_public(y0)  # first iteration: public y_0, local
    for _ in range(max(iterations - 1, 0)):
        y = sec_mul(y, 2.0 - sec_mul(scaled, y))
    return y.mul_public(1.0 / scale)


def sec_div(
    u: SharedTensor, v: SharedTensor, v_range: tuple[float, float], *, check_range: bool = True
) -> SharedTensor:
    """SecDiv: shares of u / v (fixed point) for v in the public range ``v_range`` (v > 0).

    Raises:
        SecureComputationError: With ``check_range``, if some v lies outside ``v_range``.
    """
    lo, hi = _check_range("v_range", v_range)
    if check_range:
        sec_check_range(v, (lo, hi), "sec_div")
    scale = math.sqrt(lo * hi)
    inverse_scaled = sec_reciprocal(
        v.mul_public(1.0 / scale), (lo / scale, hi / scale), check_range=False
    )
    return sec_mul(u, inverse_scaled).mul_public(1.0 / scale)


def sec_sqrt(
    x: SharedTensor, x_range: tuple[float, float], *, check_range: bool = True
) -> SharedTensor:
    """Shares of sqrt(x) for x in the public range ``x_range`` (lo > 0), by Newton iteration.

    Raises:
        SecureComputationError: With ``check_range``, if some x lies outside ``x_range``.
    """
    scaled, scale, rho = _centred(x, "x_range", x_range, check_range, "sec_sqrt")
    f = x.party.fixed_point.frac_bits
    # t = sqrt(scaled) * y: t <- t (3 - t^2) / 2, worst start 1/rho
    iterations = newton_iterations(lambda t: t * (3.0 - t * t) / 2.0, 1.0 / rho, f)
    y0 = rho**-0.5
    y = (1.5 - scaled.mul_public(0.5 * y0 * y0)).mul_public(y0)  # first iteration, local
    for _ in range(max(iterations - 1, 0)):
        t = sec_mul(sec_mul(scaled, y), y)  # (x y) y: not x (y^2), whose LSB x amplifies
        y = sec_mul(y, 1.5 - t.mul_public(0.5))
    return sec_mul(scaled, y).mul_public(math.sqrt(scale))
