"""A user's own components, outside the fedunlearn package: a BatchNorm model and a data source.

Used by the tests of user components (config ``model.factory: tests.support.own_components:
make_net``, ``data.source: tests.support.own_components:load``) and by the bad-input tests
(the factories and sources below that fail on purpose).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class BNNet(nn.Module):
    """Linear -> BatchNorm1d -> ReLU -> Linear: a model with buffers."""

    def __init__(self, features: int, num_classes: int, width: int = 16) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(features, width),
            nn.BatchNorm1d(width),
            nn.ReLU(),
            nn.Linear(width, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x.flatten(1))


def make_net(input_shape: tuple[int, ...], num_classes: int, width: int = 16) -> nn.Module:
    """The factory: ``(input_shape, num_classes, **options) -> nn.Module``."""
    return BNNet(int(np.prod(input_shape)), num_classes, width)


def make_plain(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A buffer-free MLP (the same as the built-in ``mlp`` with one hidden layer of 16)."""
    from fedunlearn.models.linear import MLP

    return MLP(input_shape, num_classes, hidden=(16,))


def load(num_clients: int, seed: int, per_client: int = 40, features: int = 6) -> dict:
    """The data source: Gaussian blobs of 3 classes, ``per_client`` samples per client."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 2.0, size=(3, features)).astype(np.float32)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, 3, size=n)
        x = centres[y] + rng.normal(0, 1.0, size=(n, features)).astype(np.float32)
        return x.astype(np.float32), y.astype(np.int64)

    clients = {c: draw(per_client) for c in range(num_clients)}
    return {"clients": clients, "test": draw(120), "held_out": {0: draw(20)}}


# --- components that fail on purpose (bad-input tests) ---


def raises(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    raise RuntimeError("no GPU kernels for this layer")


def not_a_module(input_shape: tuple[int, ...], num_classes: int) -> int:
    return 42


def wrong_classes(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return nn.Linear(int(np.prod(input_shape)), num_classes + 2)


def wrong_ids(num_clients: int, seed: int, **options: int) -> dict:
    data = load(num_clients, seed, **options)
    data["clients"] = {c + 1: v for c, v in data["clients"].items()}
    data["held_out"] = {c + 1: v for c, v in data["held_out"].items()}
    return data


def wrong_shapes(num_clients: int, seed: int, **options: int) -> dict:
    data = load(num_clients, seed, **options)
    x, y = data["clients"][1]
    data["clients"][1] = (x[:, :4], y)
    return data


def wrong_type(num_clients: int, seed: int, **options: int) -> list:
    return [1, 2, 3]


def string_labels(num_clients: int, seed: int, **options: int) -> dict:
    data = load(num_clients, seed, **options)
    x, y = data["test"]
    data["test"] = (x, y.astype(np.float32))
    return data


NOT_CALLABLE = 3
