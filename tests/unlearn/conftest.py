"""Small finished runs shared by the unlearning tests (trained once per session)."""

from __future__ import annotations

import pytest

from fedunlearn.config import parse_config
from fedunlearn.runs import train_run
from fedunlearn.testing import contract_config

# the run of fedunlearn.testing's contract checks (tests/unlearn/test_contract.py passes these)
BASE = contract_config()


CONVEX_RUN = {
    "seed": 5,
    "data": {
        "dataset": "synthetic",
        "num_clients": 6,
        "partition": "dirichlet",
        "alpha": 0.5,
        "options": {"num_samples": 600, "num_features": 12, "num_classes": 3},
    },
    "model": {"name": "logreg"},
    "training": {
        "rounds": 12,
        "local_epochs": 2,
        "lr": 0.05,
        "batch_size": 40,
        "weight_decay": 1e-3,
        "executor": "serial",
    },
    "history": {"policy": "all"},
}


@pytest.fixture
def base_config():
    """The config of the shared runs, as a dict."""
    return dict(BASE)


def _train(tmp_path_factory, name, base=BASE, **overrides):
    cfg = {**base, **overrides}
    run_dir = tmp_path_factory.mktemp(name) / "run"
    train_run(parse_config(cfg), run_dir)
    return run_dir


@pytest.fixture(scope="session")
def run_all(tmp_path_factory):
    """A backdoored digits run with every update recorded."""
    return _train(tmp_path_factory, "all")


@pytest.fixture(scope="session")
def run_every2(tmp_path_factory):
    """The same run recorded with policy every=2."""
    return _train(tmp_path_factory, "every2", history={"policy": "every", "every": 2})


@pytest.fixture(scope="session")
def run_none(tmp_path_factory):
    """The same run recording no client updates."""
    return _train(tmp_path_factory, "none", history={"policy": "none"})


@pytest.fixture(scope="session")
def convex_run(tmp_path_factory):
    """L2-regularised logistic regression on 3-class blobs, 6 Dirichlet clients, 12 rounds."""
    return _train(tmp_path_factory, "convex", base=CONVEX_RUN)
