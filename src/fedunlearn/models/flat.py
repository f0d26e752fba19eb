"""Flat-vector view of a model's state: its trainable parameters, then its buffers.

Every update, aggregate and stored model in fedunlearn is a 1-D float32 vector of length d: the
parameters in the order of ``model.parameters()``, then the persistent buffers (those
``state_dict`` saves, e.g. BatchNorm's ``running_mean``, ``running_var`` and
``num_batches_tracked``) in the order of ``model.named_buffers()``. A model without buffers has
exactly its parameters, as before buffers were carried. Integer buffers travel as float32 (exact
up to 2^24) and are rounded back when written into a module. How buffers are aggregated and
unlearned: docs/models.md.
"""

from __future__ import annotations

import torch
from torch import nn

from fedunlearn.errors import ConfigError

__all__ = [
    "check_flat",
    "federated_buffers",
    "get_flat_params",
    "num_buffer_values",
    "num_params",
    "num_trainable",
    "set_flat_params",
]


def federated_buffers(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Return ``model``'s persistent buffers (name, tensor), in ``named_buffers`` order."""
    skip = {
        f"{prefix}.{name}" if prefix else name
        for prefix, module in model.named_modules()
        for name in getattr(module, "_non_persistent_buffers_set", ())
    }
    return [(n, b) for n, b in model.named_buffers() if n not in skip]


def num_trainable(model: nn.Module) -> int:
    """Return the number of trainable scalars (the parameter part of the flat vector)."""
    return sum(p.numel() for p in model.parameters())


def num_buffer_values(model: nn.Module) -> int:
    """Return the number of buffer scalars (the tail of the flat vector)."""
    return sum(b.numel() for _, b in federated_buffers(model))


def num_params(model: nn.Module) -> int:
    """Return d, the length of the flat vector: trainable scalars plus buffer scalars."""
    return num_trainable(model) + num_buffer_values(model)


def get_flat_params(model: nn.Module) -> torch.Tensor:
    """Return a detached float32 copy of the parameters, then the buffers, as one vector of d."""
    parts = [p.detach().reshape(-1).to(torch.float32) for p in model.parameters()]
    parts += [b.detach().reshape(-1).to(torch.float32) for _, b in federated_buffers(model)]
    return torch.cat(parts)


def check_flat(flat: torch.Tensor, d: int) -> None:
    """Raise ``ConfigError`` unless ``flat`` is a flat vector of ``d`` elements."""
    if flat.ndim != 1 or flat.numel() != d:
        raise ConfigError(
            f"flat parameter vector has shape {tuple(flat.shape)}; this model needs ({d},)"
        )


@torch.no_grad()
def set_flat_params(model: nn.Module, flat: torch.Tensor) -> nn.Module:
    """Copy a flat vector into the model's parameters and buffers in place; return the model.

    Integer buffers (``num_batches_tracked``) receive the rounded value.

    Raises:
        ConfigError: if ``flat`` does not have exactly d elements.
    """
    check_flat(flat, num_params(model))
    offset = 0
    for p in model.parameters():
        n = p.numel()
        p.copy_(flat[offset : offset + n].view_as(p))
        offset += n
    for _, b in federated_buffers(model):
        n = b.numel()
        part = flat[offset : offset + n].view_as(b)
        b.copy_(part if b.is_floating_point() else part.round())
        offset += n
    return model
