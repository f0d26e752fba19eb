"""Confidence intervals of the receipt's statistical figures, with their sample sizes.

Each rule puts the interval of the figure it judged in its evidence (``evidence["interval"]``:
``{"value", "low", "high", "n", "level", "method"}``) so every figure a receipt prints carries
its sampling noise:

- a share of inputs (ASR, test accuracy, a marker rate): the Wilson score interval on ``n``
  inputs (Wilson, JASA 1927), which stays inside [0, 1] at shares near 0 or 1;
- an AUC on ``n1`` members and ``n2`` non-members: ``A +- z SE(A)`` with Hanley and McNeil's
  standard error at ``A`` (Radiology 1982, Eq. 2, Q1 = A / (2 - A), Q2 = 2 A^2 / (1 + A));
- a mean over examples (the client-level score): ``mean +- z sd / sqrt(n)``.

Distances between parameter vectors are exact (no sampling) and get no interval.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["LEVEL", "Z", "auc_interval", "mean_interval", "wilson"]

LEVEL = 0.95
Z = 1.959963984540054  # two-sided 95% normal quantile


def _interval(value: float, low: float, high: float, n: Any, method: str) -> dict[str, Any]:
    return {"value": value, "low": low, "high": high, "n": n, "level": LEVEL, "method": method}


def wilson(share: float | None, n: int | None) -> dict[str, Any] | None:
    """The Wilson score interval of a share measured on ``n`` inputs (None when unknown)."""
    if share is None or not n or n < 1 or not math.isfinite(share):
        return None
    z2 = Z * Z
    centre = (share + z2 / (2 * n)) / (1 + z2 / n)
    half = Z * math.sqrt(share * (1 - share) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return _interval(share, max(0.0, centre - half), min(1.0, centre + half), n, "wilson")


def auc_interval(auc: float | None, samples: Any) -> dict[str, Any] | None:
    """``auc +- z SE`` (Hanley-McNeil at ``auc``) on ``samples = [members, non-members]``."""
    if auc is None or not samples or not math.isfinite(auc):
        return None
    n1, n2 = int(samples[0]), int(samples[1])
    if n1 < 1 or n2 < 1:
        return None
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    var = (auc * (1 - auc) + (n1 - 1) * (q1 - auc * auc) + (n2 - 1) * (q2 - auc * auc)) / (n1 * n2)
    half = Z * math.sqrt(max(var, 0.0))
    return _interval(auc, max(0.0, auc - half), min(1.0, auc + half), [n1, n2], "hanley-mcneil")


def mean_interval(mean: float | None, se: float | None, n: int | None) -> dict[str, Any] | None:
    """``mean +- z se`` of a mean over ``n`` examples (None when unknown)."""
    if mean is None or se is None or not n or not math.isfinite(mean) or not math.isfinite(se):
        return None
    return _interval(mean, mean - Z * se, mean + Z * se, n, "normal")
