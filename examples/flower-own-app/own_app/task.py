"""own_app: the model, each node's own data, training and evaluation (plain PyTorch).

Nothing here knows fedunlearn. Each node loads its own partition (scikit-learn's bundled digits,
split by a seeded permutation into ``num-partitions`` parts, part ``partition-id``); the
server never loads any data.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F  # noqa: N812

INPUT_SHAPE = (1, 8, 8)
NUM_CLASSES = 10


class Net(nn.Module):
    """A small CNN for 8x8 digits."""

    def __init__(self, input_shape: tuple[int, ...] = INPUT_SHAPE, num_classes: int = NUM_CLASSES):
        super().__init__()
        self.conv = nn.Conv2d(input_shape[0], 8, 3)
        self.fc = nn.Linear(8 * 3 * 3, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the logits."""
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc(x.flatten(1))


def load_data(partition_id: int, num_partitions: int) -> tuple[tuple, tuple]:
    """Return this node's (train, test) tensors: its own part of the digits."""
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    part = np.array_split(order, num_partitions)[partition_id]
    x = torch.tensor(x[part] / 16.0, dtype=torch.float32).reshape(-1, *INPUT_SHAPE)
    y = torch.tensor(y[part], dtype=torch.long)
    cut = int(0.8 * len(y))
    return (x[:cut], y[:cut]), (x[cut:], y[cut:])


def train(net: nn.Module, data: tuple, epochs: int, lr: float, batch_size: int = 32) -> float:
    """Local SGD; return the mean loss of the last epoch."""
    x, y = data
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    net.train()
    total = 0.0
    for _ in range(epochs):
        total = 0.0
        for i in range(0, len(y), batch_size):
            opt.zero_grad()
            loss = F.cross_entropy(net(x[i : i + batch_size]), y[i : i + batch_size])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(y[i : i + batch_size])
    return total / max(len(y), 1)


def losses(net: nn.Module, data: tuple) -> torch.Tensor:
    """Per-sample cross-entropy losses."""
    net.eval()
    x, y = data
    with torch.no_grad():
        return F.cross_entropy(net(x), y, reduction="none")


def test(net: nn.Module, data: tuple) -> tuple[float, float]:
    """Return (loss, accuracy)."""
    x, y = data
    net.eval()
    with torch.no_grad():
        logits = net(x)
    return float(F.cross_entropy(logits, y)), float((logits.argmax(1) == y).float().mean())
