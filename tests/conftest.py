"""Shared fixtures: small synthetic federations and the real-MNIST path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedunlearn.fl.records import ClientData

# One intra-op thread per test process: the suite runs under pytest-xdist on 2 cores, and two
# processes with two threads each oversubscribe the CPU (up to 30x slower torch kernels).
torch.set_num_threads(1)

MNIST_PATH = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist.npz"


@pytest.fixture
def mnist_path() -> Path:
    if not MNIST_PATH.exists():
        pytest.skip(f"real MNIST not found at {MNIST_PATH}")
    return MNIST_PATH


def make_clients(sizes: list[int], shape=(1, 8, 8), num_classes: int = 10, seed: int = 0):
    """Return {client_id: ClientData} of random images and labels."""
    g = torch.Generator().manual_seed(seed)
    return {
        c: ClientData(
            torch.rand((n, *shape), generator=g), torch.randint(0, num_classes, (n,), generator=g)
        )
        for c, n in enumerate(sizes)
    }
