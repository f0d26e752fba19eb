"""Distances between models: in parameter space and in what they predict.

Unlearning papers compare an unlearned model u with the model r retrained without the forgotten
data, and with the original model o: ``||u - r||_2`` and its relative form
``||u - r|| / ||o - r||``, the cosine of two parameter vectors, and how often two models predict
the same class. All parameter vectors are the flat float32 vectors of
``fedunlearn.models.flat``; sums are accumulated in float64.

Paper: the quantity Theorem 1 of Starfish (Sec. V-C) and of Crab (Sec. IV-C) bounds, which no
paper reports; Mini-Unlearning's retrained reference w*_T (Sec. 4.1, Eq. 2); FedEraser's
prediction difference (Liu et al., IWQoS 2021), here as the share of equal top-1 predictions.
Why these figures: EV10 in docs/evaluation.md.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.fl.metrics import predict_logits


def _as_float64_pair(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``a`` and ``b`` as float64 vectors after checking they are comparable."""
    if a.ndim != 1 or b.ndim != 1 or a.shape != b.shape:
        raise ConfigError(
            "parameter vectors must be 1-D and of equal length; got shapes "
            f"{tuple(a.shape)} and {tuple(b.shape)}. Flatten them with get_flat_params."
        )
    return a.detach().to(torch.float64), b.detach().to(torch.float64)


def l2_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """Return the Euclidean distance ``||a - b||_2`` of two flat parameter vectors.

    Raises:
        ConfigError: if the vectors are not 1-D of equal length.
    """
    a64, b64 = _as_float64_pair(a, b)
    return float(torch.linalg.vector_norm(a64 - b64))


def cosine_similarity(a: torch.Tensor, b: torch.Tensor) -> float:
    """Return ``<a, b> / (||a|| ||b||)`` for two flat vectors (parameters or updates).

    Returns:
        A value in [-1, 1]; ``nan`` (with a warning) when either vector is zero, since the angle
        is then undefined (e.g. the update of a method that changed nothing).

    Raises:
        ConfigError: if the vectors are not 1-D of equal length.
    """
    a64, b64 = _as_float64_pair(a, b)
    norms = float(torch.linalg.vector_norm(a64)) * float(torch.linalg.vector_norm(b64))
    if norms == 0.0:
        warnings.warn(
            "cosine_similarity of a zero vector is undefined; returning nan", stacklevel=2
        )
        return math.nan
    return max(-1.0, min(1.0, float(a64 @ b64) / norms))


def relative_distance(
    unlearned: torch.Tensor, retrained: torch.Tensor, original: torch.Tensor
) -> float:
    """Return ``||u - r|| / ||o - r||``: the share of the original-to-retrained gap left.

    0 means the unlearned model u is the retrained model r; 1 means it is as far from r as the
    original model o (no better than doing nothing, measured by distance).

    Edge case: when ``original == retrained`` the gap is zero (nothing to unlearn, e.g. the
    forgotten client never took part). The ratio is then ``0.0`` if ``unlearned`` equals them
    too and ``inf`` otherwise; both cases warn.

    Raises:
        ConfigError: if the vectors are not 1-D of equal length.
    """
    gap = l2_distance(original, retrained)
    left = l2_distance(unlearned, retrained)
    if gap == 0.0:
        warnings.warn(
            "relative_distance: original and retrained models are identical (zero gap); "
            f"returning {'0.0' if left == 0.0 else 'inf'}",
            stacklevel=2,
        )
        return 0.0 if left == 0.0 else math.inf
    return left / gap


def prediction_agreement(
    model: nn.Module, params_a: torch.Tensor, params_b: torch.Tensor, x: torch.Tensor
) -> float:
    """Return the share of inputs ``x`` on which two parameter vectors predict the same class.

    Args:
        model: Template module (not modified).
        params_a: Flat parameters of the first model.
        params_b: Flat parameters of the second model.
        x: Inputs, e.g. the test set.

    Returns:
        The fraction of equal top-1 predictions; ``nan`` if ``x`` is empty.
    """
    if len(x) == 0:
        return math.nan
    pred_a = predict_logits(model, params_a, x).argmax(dim=1)
    pred_b = predict_logits(model, params_b, x).argmax(dim=1)
    return float((pred_a == pred_b).to(torch.float64).mean())
