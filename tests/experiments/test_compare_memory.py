"""``compare_methods`` holds at most one method's trajectory at a time (issue 35).

A trajectory is (2 + n_t) d float32 values per round; at 1,000 clients x 200 rounds of the MNIST
MLP it is about 1 GB, so a comparison that kept the previous method's while the next one ran
peaked at two of them (docs/performance.md, "1,000 clients").
"""

from __future__ import annotations

import gc

import pytest

from fedunlearn.config import parse_config
from fedunlearn.eval import ReceiptOptions
from fedunlearn.experiments import compare_methods
from fedunlearn.history.trajectory import Trajectory
from fedunlearn.runs import train_run

RUN = {
    "seed": 5,
    "data": {"dataset": "digits", "num_clients": 5},
    "model": {"name": "mlp", "hidden": [16]},
    "training": {"rounds": 4, "local_epochs": 1, "lr": 0.3, "batch_size": 32, "executor": "serial"},
    "history": {"policy": "all"},
}


class LiveTrajectories:
    """Progress that counts the trajectories alive when each method starts."""

    def __init__(self) -> None:
        self.at_start: dict[str, int] = {}

    def on_step(self, text: str) -> None:
        pass

    def on_method(self, name: str, index: int, total: int) -> None:
        gc.collect()
        self.at_start[name] = sum(isinstance(o, Trajectory) for o in gc.get_objects())

    def on_round(self, name: str, metrics: dict[str, float]) -> None:
        pass


@pytest.mark.slow
def test_a_method_starts_with_no_earlier_trajectory_alive(tmp_path):
    run = tmp_path / "run"
    train_run(parse_config(RUN), run)
    progress = LiveTrajectories()
    doc = compare_methods(
        run,
        [1],
        ["federaser", "fedrecover"],
        progress=progress,
        receipt=ReceiptOptions(client_test=False),
    )
    assert [r["method"] for r in doc["methods"]] == ["none", "retrain", "federaser", "fedrecover"]
    assert progress.at_start == {"retrain": 0, "none": 0, "federaser": 0, "fedrecover": 0}
