"""Model quality on held-out data: accuracy, mean loss and backdoor attack success rate.

ASR is Crab's (Sec. V-A3) read as ASR_nt: the fraction of triggered test inputs whose true label
is *not* the target that the model classifies as the target (EV1 in docs/evaluation.md). With
``device`` the forward passes run there (chunks of the inputs are copied over, logits come back to
the CPU); without it, on the CPU.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from fedunlearn.fl.attacks import BackdoorTrigger
from fedunlearn.fl.device import cuda_determinism, resolve_device
from fedunlearn.models.flat import set_flat_params

# Round metric: the n_c-weighted mean of the clients' losses on their own data (computed by the
# server in ``fedunlearn.runs``; FedADP's budget schedule and stage selection read it).
CLIENTS_LOSS_KEY = "clients_loss"


@torch.no_grad()
def predict_logits(
    model: nn.Module,
    params: torch.Tensor,
    x: torch.Tensor,
    batch_size: int = 2048,
    device: str | torch.device | None = None,
) -> torch.Tensor:
    """Return the logits (on the CPU) of the model with flat parameters ``params`` on ``x``.

    Args:
        model: Template module; it is not modified.
        params: Flat parameters.
        x: Inputs, on any device.
        batch_size: Rows per forward pass.
        device: Where the forward passes run (default: the CPU).
    """
    where = resolve_device(device)
    net = set_flat_params(copy.deepcopy(model).to(where), params.to(where)).eval()
    if not len(x):
        return torch.empty(0)
    with cuda_determinism(where):
        return torch.cat([net(chunk.to(where)).cpu() for chunk in x.split(batch_size)])


def accuracy_and_loss(
    model: nn.Module,
    params: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    device: str | torch.device | None = None,
) -> tuple[float, float]:
    """Return (top-1 accuracy, mean cross-entropy) on (x, y), computed on ``device``."""
    logits = predict_logits(model, params, x, device=device)
    y = y.cpu()
    acc = float((logits.argmax(dim=1) == y).to(torch.float64).mean())
    return acc, float(F.cross_entropy(logits, y))


def backdoor_success_rate(
    model: nn.Module,
    params: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    trigger: BackdoorTrigger,
    target_label: int,
    device: str | torch.device | None = None,
) -> float:
    """Return the share of triggered non-target inputs classified as ``target_label``."""
    keep = y != target_label
    if not bool(keep.any()):
        return float("nan")
    logits = predict_logits(model, params, trigger.apply(x[keep]), device=device)
    return float((logits.argmax(dim=1) == target_label).to(torch.float64).mean())
