"""TensorBoard round observer: the scalars written are the round metrics, readable back."""

import builtins
import math

import pytest
import torch

from fedunlearn.errors import ConfigError
from fedunlearn.fl.records import ClientUpdate, RejectedUpdate, RoundRecord

pytest.importorskip("tensorboard", reason="tensorboard is not installed")

from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)

from fedunlearn.fl.tracking import TensorBoardWriter  # noqa: E402


def record(round_, acc, loss, rejected=0):
    update = ClientUpdate(0, torch.zeros(3), 5, 0.5)
    return RoundRecord(
        round=round_,
        global_before=torch.zeros(3),
        global_after=torch.zeros(3),
        aggregate=torch.zeros(3),
        updates=(update, update),
        rejected=tuple(RejectedUpdate(9, "nan", 5) for _ in range(rejected)),
        metrics={"test_accuracy": acc, "test_loss": loss, "note": "text", "bad": math.nan},
    )


def read_scalars(log_dir):
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def test_round_metrics_become_scalars_per_round(tmp_path):
    # Execute
    with TensorBoardWriter(tmp_path / "tb", prefix="train/") as writer:
        writer.on_round_end(record(1, 0.5, 2.0))
        writer.on_round_end(record(2, 0.75, 1.0, rejected=1))

    # Assert: numeric finite metrics only, step = round
    scalars = read_scalars(tmp_path / "tb")
    assert sorted(scalars) == [
        "train/num_accepted",
        "train/num_rejected",
        "train/test_accuracy",
        "train/test_loss",
    ]
    assert scalars["train/test_accuracy"] == [(1, 0.5), (2, 0.75)]
    assert scalars["train/test_loss"] == [(1, 2.0), (2, 1.0)]
    assert scalars["train/num_rejected"] == [(1, 0.0), (2, 1.0)]


def test_closed_writer_refuses_and_missing_package_is_a_clear_error(tmp_path, monkeypatch):
    writer = TensorBoardWriter(tmp_path / "tb")
    writer.close()
    writer.close()
    with pytest.raises(ConfigError, match="closed"):
        writer.on_round_end(record(1, 0.5, 2.0))

    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.startswith("torch.utils.tensorboard"):
            raise ImportError("No module named 'tensorboard'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    with pytest.raises(ConfigError, match='pip install "fedunlearn\\[tensorboard\\]"'):
        TensorBoardWriter(tmp_path / "other")
