"""The model, the data of each node and of the server, and the training loop."""

from functools import cache

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn


class Net(nn.Module):
    """A two-layer perceptron for 8x8 digit images."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


@cache  # loaded once per process
def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = load_digits(return_X_y=True)
    order = np.random.default_rng(42).permutation(len(labels))  # the same on every machine
    x = torch.tensor(images[order] / 16.0, dtype=torch.float32)
    return x, torch.tensor(labels[order], dtype=torch.long)


def load_partition(partition_id: int, num_partitions: int):
    """One node's share of the first 80% of the digits (IID), split 80/20 into train/validation."""
    x, y = _digits()
    pool = int(0.8 * len(y))
    part = np.array_split(np.arange(pool), num_partitions)[partition_id]
    cut = int(0.8 * len(part))
    return (x[part[:cut]], y[part[:cut]]), (x[part[cut:]], y[part[cut:]])


def load_test_set():
    """The last 20% of the digits, which no node holds: the server's test set."""
    x, y = _digits()
    pool = int(0.8 * len(y))
    return x[pool:], y[pool:]


def train(net: Net, data, epochs: int, lr: float, batch_size: int) -> float:
    """Train with SGD on shuffled mini-batches; return the average loss of the last epoch."""
    x, y = data
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    net.train()
    running = 0.0
    for _ in range(epochs):
        running = 0.0
        order = torch.randperm(len(y))
        for start in range(0, len(y), batch_size):
            batch = order[start : start + batch_size]
            optimizer.zero_grad()
            loss = loss_fn(net(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
            running += loss.item() * len(batch)
    return running / len(y)


def evaluate(net: Net, data) -> tuple[float, float]:
    """Return the loss and accuracy of ``net`` on ``data``."""
    x, y = data
    net.eval()
    with torch.no_grad():
        logits = net(x)
    loss = nn.functional.cross_entropy(logits, y).item()
    return loss, (logits.argmax(dim=1) == y).float().mean().item()
