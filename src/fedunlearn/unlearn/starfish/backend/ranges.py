"""The declared ring range of every Starfish 2PC step, checked on the clients' plaintext side.

Every product the two servers compute lives in Z_2^64 before any truncation, at scale 2f (two
f-bit operands); a product whose magnitude reaches 2^63 wraps and the result is silently wrong
(a square turns negative, a cross-product flips a comparison). SecGE needs one bit more: the
difference of two values must stay below 2^63, so each value stays below 2^62 (``HEADROOM_BITS``).
The largest product of each step (real units) and when it fits:

- TD^2: [delta^j]^2, exact at scale 2f: fits when delta < 2^(31 - f);
- TD^1: every [G(k)]^2, exact at scale 2f: |G(k)| < 2^(31 - f);
- SecTC: [G_hat(k)]^2, exact at scale 2f: |G_hat(k)| < 2^(31 - f);
- SecRS Method 1: u_i v_j (SecGE2, untruncated) with |u| <= v = ||g|| <= hi: hi < 2^(31 - f);
- SecRS Method 2: u (c / v) inside SecDiv, |u| <= v in [lo, hi] (checked securely),
  c = sqrt(lo hi): c < 2^(62 - 2f);
- SecRS^alt Method 1: a_i v_j (SecGE4), a = u^2 <= v = ||g||^2 <= hi^2: hi < 2^((62 - 2f) / 4);
- SecRS^alt Method 2: a (c / v) inside SecDiv, c = lo hi: lo hi < 2^(62 - 2f);
- SecUE: S^T Y, Y^T v, Mid^-1 p, Y q (truncated SecMul at scale 2f): each y = G_bar - G_r is
  a difference of two checked client values, but the inner products sum m terms and the
  products after SecMI depend on the curvature: an assumption (below);

so one bound, ``coordinate_bound = 2^(31 - f)`` (32,768 at f = 16, 262,144 at f = 13), covers
every value a client shares. It is applied to the *encoded* value: a value is accepted when
round(2^f |x|) < 2^31 ring units, so its exact square is at most (2^31 - 1)^2 < 2^62 (a real
value just below 2^(31 - f) rounds up to 2^31, whose square is exactly 2^62: refused since
issue 41, where the check compared the real value and the docs claimed "below 2^62"). It
covers each update coordinate (TD, SecTC's exact updates, SecUE's y =
G_bar - G_r), its threshold (delta <= max |G(k)|) and its norm (Method 1's v). The clients check
it *before* encoding (``check_client_values``: the in-process simulation's ``share``, the
Stage I sharing and the clients service), so an out-of-range update stops the run with
``RingRangeError`` naming the steps, and never a wrong result. The error names the bound and how
many entries exceed it, never a value (it reaches both servers). The declared ``norm_range`` is
checked where a norm is used in the clear (``check_norm``: Method 1/2's client norm) and, per
method, against the headroom above (``check_selection``: a declared range whose products
cannot fit is refused when SecRS starts, naming the method).

Not covered by a plaintext check: SecUE's inner products (fit while ||s|| ||y|| 2^(f + p) <
2^62, p the public operand's bits), its products after SecMI, and SecTC's *estimates*
G_hat = G_r + B v are computed in 2PC, so their bound is an assumption on the estimator (an
estimate of an update has the update's scale); an estimate beyond 2^(31.5 - f) is not
flagged reliably. (A check per coordinate would double SecTC's comparisons; the public
bounds available on the curvature pairs are too loose to bound B v from a few secret
scalars.) The opened aggregate is checked (``MpcBackend.reveal``: norm above ``norm_range[1]``
or a wild value stops the run), which catches such an estimate of an unflagged client once it
is aggregated, not before. SecRS Method 1's client-supplied norms are also checked in 2PC
against ``norm_range`` (``check_range``: 2T + 1 comparisons, one opened bit), since in the
deployment no server sees them in the clear.

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Sec. VI-A (Z_2^64, 13 fractional bits), Alg. 1-3 (the steps), App. B-B (SecMul, SecGE).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from fedunlearn.errors import ConfigError, SecureComputationError

__all__ = ["HEADROOM_BITS", "RingRangeError", "StepRanges"]

HEADROOM_BITS = 62  # |value| < 2^62 in ring units: a SecGE difference stays below 2^63
_COORDINATE_STEPS = "TD^2 and SecTC (exact squares), SecRS Method 1 (norm products), SecUE"


class RingRangeError(SecureComputationError):
    """A client value does not fit a 2PC step's ring range (checked before sharing)."""


@dataclass(frozen=True)
class StepRanges:
    """The declared ring range of every step, derived from f and the public ``norm_range``.

    Args:
        frac_bits: Fixed-point fractional bits f.
        norm_range: Public bounds (lo, hi) on update norms; None: only the ring headroom.
    """

    frac_bits: int
    norm_range: tuple[float, float] | None = None

    @property
    def coordinate_bound(self) -> float:
        """Bound on a shared client value's magnitude, 2^(31 - f) (see ``fits``: after rounding)."""
        return 2.0 ** ((HEADROOM_BITS - 2 * self.frac_bits) / 2)

    def fits(self, values: ArrayLike) -> np.ndarray:
        """Whether each value encodes below 2^31 ring units: round(2^f |x|) < 2^31.

        Then its exact square at scale 2f is at most (2^31 - 1)^2, strictly below 2^62, and a
        product of two such values too. NaN and infinities do not fit.
        """
        x = np.asarray(values, dtype=np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            units = np.abs(np.rint(x * 2.0**self.frac_bits))
        return units < 2.0 ** (HEADROOM_BITS // 2)

    def check_client_values(self, values: ArrayLike, what: str = "a client update") -> None:
        """Refuse client values outside ``coordinate_bound`` (or not finite) before encoding.

        Raises:
            RingRangeError: Naming the steps, the bound and the count; never a value.
        """
        x = np.asarray(values, dtype=np.float64)
        bad = int(np.count_nonzero(~self.fits(x)))  # NaN counts as bad
        if bad:
            raise RingRangeError(
                f"{what} does not fit the 2PC ring at f = {self.frac_bits}: {bad} of {x.size} "
                f"values are not finite or round to |x| >= 2^{31 - self.frac_bits} = "
                f"{self.coordinate_bound:g}, the range of {_COORDINATE_STEPS} (products at "
                f"scale 2f below 2^{HEADROOM_BITS}). It was not shared. Lower frac_bits (each "
                "bit doubles the range) or scale the updates down (e.g. units=delta)."
            )

    def check_norm(self, norm: float, step: str = "SecRS") -> None:
        """Refuse a client norm outside the declared ``norm_range`` (or the ring range).

        Raises:
            RingRangeError: Naming the step and the range; never the norm.
        """
        lo, hi = self.norm_range if self.norm_range is not None else (0.0, math.inf)
        hi = min(hi, self.coordinate_bound)
        if not (lo <= norm <= hi and bool(self.fits(norm))):
            raise RingRangeError(
                f"{step}: a target's update norm lies outside the declared norm_range "
                f"[{lo:g}, {hi:g}] (capped by the ring range 2^{31 - self.frac_bits} at "
                f"f = {self.frac_bits}). It was not shared. Declare a norm_range that holds."
            )

    def check_selection(self, method: str) -> None:
        """Refuse a declared ``norm_range`` whose SecRS products cannot fit the ring.

        Raises:
            ConfigError: Naming the method, its largest product and the fix.
        """
        if self.norm_range is None:
            return
        lo, hi = self.norm_range
        f = self.frac_bits
        # the largest product of each order, in real units (module table)
        largest = {
            "method1": hi * hi,
            "method2": math.sqrt(lo * hi),
            "alt_method1": hi**4,
            "alt_method2": lo * hi,
        }.get(method)
        if largest is None:
            raise ConfigError(f"unknown selection method {method!r}")
        limit = 2.0 ** (HEADROOM_BITS - 2 * f)
        if not largest < limit:
            power = {"method1": 2, "alt_method1": 4}.get(method, 1)
            raise ConfigError(
                f"SecRS {method}: norm_range {self.norm_range!r} gives ring products up to "
                f"{largest:.3g} at scale 2f, above 2^{HEADROOM_BITS - 2 * f} = {limit:g} at "
                f"f = {f}; results would wrap silently. Declare norm_range[1] < "
                f"{limit ** (1 / power):.4g} or lower frac_bits."
            )
