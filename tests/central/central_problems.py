"""Small float64 problems shared by the centralised tests (docs/methods/mini_unlearning.md)."""

from __future__ import annotations

import torch


def blobs(n: int = 600, d: int = 5, classes: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    means = 1.5 * torch.randn(classes, d, generator=g, dtype=torch.float64)
    y = torch.arange(n) % classes
    x = means[y] + torch.randn(n, d, generator=g, dtype=torch.float64)
    return x, y


def pick_forget(n: int, ratio: float, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=g)[: round(ratio * n)].sort().values
