"""Model quality on held-out data: accuracy, mean loss and backdoor attack success rate.

ASR follows Crab spec §4.3: the fraction of triggered test inputs whose true label is *not* the
target that the model classifies as the target.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from fedunlearn.fl.attacks import Trigger
from fedunlearn.models.flat import set_flat_params

# Round metric: the n_c-weighted mean of the clients' losses on their own data (computed by the
# server in ``fedunlearn.runs``; FedADP's budget schedule and stage selection read it).
CLIENTS_LOSS_KEY = "clients_loss"


@torch.no_grad()
def predict_logits(
    model: nn.Module, params: torch.Tensor, x: torch.Tensor, batch_size: int = 2048
) -> torch.Tensor:
    """Return the logits of the model with flat parameters ``params`` on ``x``."""
    net = set_flat_params(copy.deepcopy(model), params).eval()
    return torch.cat([net(chunk) for chunk in x.split(batch_size)]) if len(x) else torch.empty(0)


def accuracy_and_loss(
    model: nn.Module, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor
) -> tuple[float, float]:
    """Return (top-1 accuracy, mean cross-entropy) on (x, y)."""
    logits = predict_logits(model, params, x)
    acc = float((logits.argmax(dim=1) == y).to(torch.float64).mean())
    return acc, float(F.cross_entropy(logits, y))


def backdoor_success_rate(
    model: nn.Module,
    params: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    trigger: Trigger,
    target_label: int,
) -> float:
    """Return the share of triggered non-target inputs classified as ``target_label``."""
    keep = y != target_label
    if not bool(keep.any()):
        return float("nan")
    logits = predict_logits(model, params, trigger.apply(x[keep]))
    return float((logits.argmax(dim=1) == target_label).to(torch.float64).mean())
