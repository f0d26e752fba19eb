"""Multinomial logistic regression and the multilayer perceptron."""

from __future__ import annotations

import math

import torch
from torch import nn


class LogisticRegression(nn.Module):
    """Softmax regression: flatten, then one linear layer."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(math.prod(input_shape), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits of shape (batch, num_classes)."""
        return self.linear(x.flatten(1))


class MLP(nn.Module):
    """Flatten, then Linear-ReLU blocks of the given widths, then a linear classifier."""

    def __init__(
        self, input_shape: tuple[int, ...], num_classes: int, hidden: tuple[int, ...] = (128,)
    ) -> None:
        super().__init__()
        widths = [math.prod(input_shape), *hidden]
        layers: list[nn.Module] = [nn.Flatten()]
        for a, b in zip(widths[:-1], widths[1:], strict=True):
            layers += [nn.Linear(a, b), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits of shape (batch, num_classes)."""
        return self.net(x)
