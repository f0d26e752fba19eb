"""Backdoor attack success rate (ASR) on test inputs and on the forgotten clients' own data.

Two places to measure whether a backdoor survived unlearning:

- ``backdoor_success_rate`` (re-exported from ``fedunlearn.fl.metrics``): triggered test inputs
  whose true label is not the target (Crab's ASR_nt);
- ``client_backdoor_success_rate``: the forgotten clients' own training inputs with the trigger
  stamped on, again only those whose true label is not the target (Starfish's BA-ASR, FedADP's
  ASR, the quantity Crab's code measures).

Paper: Crab, Sec. V-A3 (ASR, read as ASR_nt: EV1 in docs/evaluation.md; the authors' code
measures it on the malicious clients' triggered training data); FedADP, Sec. VI-A3 (target
clients' training inputs with the trigger); Starfish, Sec. VI-A (BA-ASR on the target clients'
triggered data).
Deviations: [REC] inputs are the clients' *clean* data plus the ``Trigger``, excluding samples
whose true label is the target, since a poisoned sample's true label is lost once it is
relabelled; pass the poisoned copies as well to restrict the rate to the samples the attack
actually poisoned (EV2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.fl.attacks import BackdoorTrigger
from fedunlearn.fl.metrics import backdoor_success_rate, predict_logits
from fedunlearn.fl.records import ClientData

__all__ = ["backdoor_success_rate", "client_backdoor_success_rate"]


def client_backdoor_success_rate(
    model: nn.Module,
    params: torch.Tensor,
    clean: Sequence[ClientData],
    trigger: BackdoorTrigger,
    target_label: int,
    *,
    poisoned: Sequence[ClientData] | None = None,
) -> float:
    """Return the share of the clients' triggered non-target samples classified as the target.

    Without ``poisoned``, every clean sample whose true label is not ``target_label`` gets the
    trigger stamped on and counts. With ``poisoned`` (the same clients' data after
    ``backdoor_data``, aligned sample by sample), only the poisoned samples count: those whose
    clean label is not the target and whose poisoned label is the target.

    Args:
        model: Template module (not modified).
        params: Flat parameters of the model to evaluate.
        clean: The forgotten clients' clean training data (true labels), one entry per client.
        trigger: The trigger the attackers used.
        target_label: The backdoor's target class.
        poisoned: Optional poisoned copies of ``clean``, same order and sizes.

    Returns:
        The attack success rate in [0, 1]; ``nan`` if no sample qualifies.

    Raises:
        ConfigError: if ``clean`` is empty or ``poisoned`` does not line up with it.
    """
    if len(clean) == 0:
        raise ConfigError("client_backdoor_success_rate needs at least one client's clean data")
    if poisoned is not None:
        if len(poisoned) != len(clean):
            raise ConfigError(
                f"poisoned has {len(poisoned)} clients but clean has {len(clean)}; "
                "pass the poisoned copy of every clean client, in the same order"
            )
        for i, (c, p) in enumerate(zip(clean, poisoned, strict=True)):
            if len(c) != len(p):
                raise ConfigError(
                    f"client #{i}: clean data has {len(c)} samples, poisoned data {len(p)}; "
                    "they must be the same samples in the same order"
                )
    inputs = []
    for i, c in enumerate(clean):
        keep = c.y != target_label
        if poisoned is not None:
            keep &= poisoned[i].y == target_label
        inputs.append(c.x[keep])
    x = torch.cat(inputs)
    if len(x) == 0:
        return math.nan
    logits = predict_logits(model, params, trigger.apply(x))
    return float((logits.argmax(dim=1) == target_label).to(torch.float64).mean())
