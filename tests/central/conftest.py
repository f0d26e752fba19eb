"""Fixtures: the ridge and logistic-regression runs of the checks MUV1-MUV8 (float64)."""

from __future__ import annotations

import pytest
import torch
from central_problems import blobs

from fedunlearn.central import RidgeRegression, SGDSpec, SoftmaxRegression, train_sgd


@pytest.fixture(scope="module")
def ridge():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(600, 5, generator=g, dtype=torch.float64)
    y = x @ torch.randn(5, generator=g, dtype=torch.float64) + 0.1 * torch.randn(
        600, generator=g, dtype=torch.float64
    )
    objective = RidgeRegression(x, y, 0.005)
    record = train_sgd(objective, SGDSpec(lr=0.05, batch_size=32, passes=30, seed=0))
    return objective, record


@pytest.fixture(scope="module")
def logreg():
    x, y = blobs()
    objective = SoftmaxRegression(x, y, 3, 0.005)
    record = train_sgd(
        objective, SGDSpec(lr=0.05, batch_size=32, passes=30, seed=0), cache_batch_grads=True
    )
    return objective, record
