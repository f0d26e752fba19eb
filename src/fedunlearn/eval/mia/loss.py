"""The loss-threshold attack (Yeom et al., IEEE CSF 2018): a member iff its loss is small.

Yeom's threshold is the expected training loss; by default the threshold is instead picked on a
seeded calibration split of the given samples (Youden's J), or given (``threshold=``, e.g. from
``calibrate_loss_threshold`` on reference data).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.eval.mia.common import (
    MIAResult,
    model_log_probs,
    sample_losses,
    split_indices,
    summarise,
)
from fedunlearn.fl.seeding import derive_seed, torch_generator


def _youden_loss_threshold(member_losses: np.ndarray, nonmember_losses: np.ndarray) -> float:
    """Return the loss threshold maximising TPR - FPR of "member iff loss <= threshold"."""
    from sklearn.metrics import roc_curve

    labels = np.concatenate([np.ones(len(member_losses)), np.zeros(len(nonmember_losses))])
    scores = -np.concatenate([member_losses, nonmember_losses])
    fpr, tpr, thresholds = roc_curve(labels, scores)
    best = int(np.argmax(tpr - fpr))  # first maximum: the strictest of equally good thresholds
    if not np.isfinite(thresholds[best]):  # nothing beats "nobody is a member"
        return float(np.nextafter(-scores.max(), -np.inf))
    return float(-thresholds[best])


def _losses(
    model: nn.Module, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, what: str
) -> np.ndarray:
    """Per-sample cross-entropy of the model on ``(x, y)`` (``what`` names them in errors)."""
    return sample_losses(model_log_probs(model, params, x, y, what), y).numpy()


def calibrate_loss_threshold(
    model: nn.Module,
    params: torch.Tensor,
    members_x: torch.Tensor,
    members_y: torch.Tensor,
    nonmembers_x: torch.Tensor,
    nonmembers_y: torch.Tensor,
) -> float:
    """Return the loss threshold that best separates known members from known non-members.

    The threshold maximises Youden's J = TPR - FPR of "member iff loss <= threshold". For
    Starfish's MIA-ASR (Sec. VI-A, which names no attack; EV8 in docs/evaluation.md): calibrate
    on the remaining clients' data against test data, then pass the result as ``threshold`` to
    ``loss_threshold_attack`` on the forgotten client's data.

    Raises:
        ConfigError: on empty or mismatched data, or labels out of range.
    """
    return _youden_loss_threshold(
        _losses(model, params, members_x, members_y, "members"),
        _losses(model, params, nonmembers_x, nonmembers_y, "non-members"),
    )


def loss_threshold_attack(
    model: nn.Module,
    params: torch.Tensor,
    members_x: torch.Tensor,
    members_y: torch.Tensor,
    nonmembers_x: torch.Tensor,
    nonmembers_y: torch.Tensor,
    *,
    threshold: float | None = None,
    calibration_fraction: float = 0.5,
    seed: int = 0,
) -> MIAResult:
    """Run the loss-threshold attack (Yeom et al. 2018): member iff loss <= threshold.

    The membership score is ``-loss``; the AUC needs no threshold.

    Args:
        model: Template module (not modified).
        params: Flat parameters of the attacked model.
        members_x: Inputs of the samples to test as members (e.g. the forgotten clients' data).
        members_y: Their labels.
        nonmembers_x: Inputs the model never saw (e.g. test data).
        nonmembers_y: Their labels.
        threshold: A fixed loss threshold, e.g. the mean training loss (Yeom's choice) or
            ``calibrate_loss_threshold`` on reference data; every sample is then scored. If
            ``None``, a seeded ``calibration_fraction`` of the members and of the non-members
            picks the threshold (Youden's J) and every number is reported on the rest.
        calibration_fraction: Share of each set used to pick the threshold, in (0, 1).
        seed: Seed of the calibration split.

    Returns:
        The attack's ``MIAResult`` (``attack="loss_threshold"``).

    Raises:
        ConfigError: on empty or mismatched data, labels out of range, a calibration split
            leaving a part empty, or ``calibration_fraction`` outside (0, 1).
    """
    member = _losses(model, params, members_x, members_y, "members")
    nonmember = _losses(model, params, nonmembers_x, nonmembers_y, "non-members")
    if threshold is None:
        if not 0.0 < calibration_fraction < 1.0:
            raise ConfigError(
                f"calibration_fraction must lie in (0, 1); got {calibration_fraction}"
            )
        generator = torch_generator(derive_seed(seed, "mia_calibration"))
        cal_m, eval_m = split_indices(len(member), calibration_fraction, generator, "members")
        cal_n, eval_n = split_indices(
            len(nonmember), calibration_fraction, generator, "non-members"
        )
        threshold = _youden_loss_threshold(member[cal_m.numpy()], nonmember[cal_n.numpy()])
        member, nonmember = member[eval_m.numpy()], nonmember[eval_n.numpy()]
    elif not math.isfinite(threshold):
        raise ConfigError(f"threshold must be a finite loss value; got {threshold}")
    return summarise(
        "loss_threshold",
        -member,
        -nonmember,
        member <= threshold,
        nonmember <= threshold,
        threshold,
    )


# --- learned attacks -------------------------------------------------------------------------
