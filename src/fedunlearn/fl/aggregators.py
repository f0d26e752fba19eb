"""Aggregation rules: turn the round's client deltas into one aggregate delta.

Each rule is a function ``(deltas (K, d), weights (K,)) -> (d,)`` built by ``make_aggregator``.
Weights are the clients' sample counts; only FedAvg uses them (the robust rules are unweighted,
as in their papers).

Papers: FedAvg (McMahan et al. 2017); coordinate-wise median and trimmed mean (Yin et al., ICML
2018, Def. 1-2); Krum and Multi-Krum (Blanchard et al., NeurIPS 2017, §4).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedunlearn.errors import ConfigError, UnknownNameError

Aggregator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def fedavg(deltas: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Return the sample-weighted mean ``sum_c (n_c / sum n) * delta_c``."""
    w = weights.to(torch.float64)
    w = w / w.sum()
    return (w.to(deltas.dtype) @ deltas).to(deltas.dtype)


def coordinate_median(deltas: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Return the coordinate-wise median (mean of the two middle values when K is even)."""
    k = deltas.shape[0]
    ordered = deltas.sort(dim=0).values
    if k % 2:
        return ordered[k // 2].clone()
    return (ordered[k // 2 - 1] + ordered[k // 2]) / 2


def trimmed_mean(deltas: torch.Tensor, trim: int) -> torch.Tensor:
    """Drop the ``trim`` largest and smallest values per coordinate and average the rest.

    Raises:
        ConfigError: if ``2 * trim >= K`` (nothing would be left).
    """
    k = deltas.shape[0]
    if trim < 0 or 2 * trim >= k:
        raise ConfigError(
            f"trimmed mean with trim={trim} needs more than {2 * trim} updates; got {k}. "
            "Lower aggregator.trim or raise participation."
        )
    ordered = deltas.sort(dim=0).values
    return ordered[trim : k - trim].mean(dim=0)


def krum_scores(deltas: torch.Tensor, num_byzantine: int) -> torch.Tensor:
    """Return each update's Krum score: summed squared distance to its K - f - 2 nearest others."""
    k = deltas.shape[0]
    neighbours = k - num_byzantine - 2
    if num_byzantine < 0 or neighbours < 1:
        raise ConfigError(
            f"Krum with f={num_byzantine} needs at least f + 3 = {num_byzantine + 3} updates; "
            f"got {k}. Lower aggregator.krum_f."
        )
    d64 = deltas.to(torch.float64)
    dist = torch.cdist(d64, d64).pow(2)
    dist.fill_diagonal_(float("inf"))
    return dist.topk(neighbours, dim=1, largest=False).values.sum(dim=1)


def multi_krum(deltas: torch.Tensor, num_byzantine: int, num_selected: int) -> torch.Tensor:
    """Average the ``num_selected`` updates with the lowest Krum scores (m = 1 is Krum)."""
    k = deltas.shape[0]
    if not 1 <= num_selected <= k:
        raise ConfigError(f"Multi-Krum needs 1 <= m <= {k} selected updates; got m={num_selected}")
    scores = krum_scores(deltas, num_byzantine)
    chosen = torch.argsort(scores, stable=True)[:num_selected]
    return deltas[chosen].mean(dim=0)


AGGREGATORS = ("fedavg", "median", "trimmed_mean", "krum", "multi_krum")


def make_aggregator(
    name: str, *, trim: int = 1, krum_f: int = 1, multi_krum_m: int | None = None
) -> Aggregator:
    """Return the aggregation function called ``name`` with its options bound.

    Args:
        name: One of ``AGGREGATORS``.
        trim: Values cut at each end per coordinate (trimmed mean's k).
        krum_f: Number of Byzantine clients Krum tolerates (f).
        multi_krum_m: Updates Multi-Krum averages (defaults to K - f).

    Raises:
        UnknownNameError: for an unknown rule.
    """
    if name == "fedavg":
        return fedavg
    if name == "median":
        return lambda deltas, weights: coordinate_median(deltas)
    if name == "trimmed_mean":
        return lambda deltas, weights: trimmed_mean(deltas, trim)
    if name == "krum":
        return lambda deltas, weights: multi_krum(deltas, krum_f, 1)
    if name == "multi_krum":

        def _multi_krum(deltas: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
            m = multi_krum_m if multi_krum_m is not None else deltas.shape[0] - krum_f
            return multi_krum(deltas, krum_f, m)

        return _multi_krum
    raise UnknownNameError(f"unknown aggregator '{name}'; available: {', '.join(AGGREGATORS)}")
