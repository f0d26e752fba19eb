"""Flat-vector view of a model's trainable parameters.

Every update, aggregate and stored model in fedunlearn is a 1-D float32 vector in the order of
``model.parameters()``. Buffers (e.g. BatchNorm statistics) are not federated.
"""

from __future__ import annotations

import torch
from torch import nn

from fedunlearn.errors import ConfigError


def num_params(model: nn.Module) -> int:
    """Return the number of trainable scalars d."""
    return sum(p.numel() for p in model.parameters())


def get_flat_params(model: nn.Module) -> torch.Tensor:
    """Return a detached copy of all parameters as one float32 vector of length d."""
    return torch.cat([p.detach().reshape(-1).to(torch.float32) for p in model.parameters()])


@torch.no_grad()
def set_flat_params(model: nn.Module, flat: torch.Tensor) -> nn.Module:
    """Copy a flat vector into the model's parameters in place and return the model.

    Raises:
        ConfigError: if ``flat`` does not have exactly d elements.
    """
    d = num_params(model)
    if flat.ndim != 1 or flat.numel() != d:
        raise ConfigError(
            f"flat parameter vector has shape {tuple(flat.shape)}; this model needs ({d},)"
        )
    offset = 0
    for p in model.parameters():
        n = p.numel()
        p.copy_(flat[offset : offset + n].view_as(p))
        offset += n
    return model
