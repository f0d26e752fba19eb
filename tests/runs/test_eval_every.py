"""``training.eval_every``: the test set measured every N rounds and at the last (issue 35).

At M = 1,000 clients and the 582k CNN, the per-round forward pass over the 10,000 MNIST test
examples cost several times the round's client training (docs/performance.md). The cadence
changes which rounds carry test metrics, never the model, and never the server loss a recording
policy reads every round.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedunlearn.config import RunConfig, parse_config
from fedunlearn.errors import ConfigError
from fedunlearn.fl.metrics import CLIENTS_LOSS_KEY
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import train_run
from fedunlearn.runs.fingerprint import run_fingerprint


def _config(eval_every: int | None, policy: str = "all") -> RunConfig:
    training: dict = {"rounds": 7, "local_epochs": 1, "lr": 0.1, "batch_size": 32}
    if eval_every is not None:
        training["eval_every"] = eval_every
    return parse_config(
        {
            "seed": 3,
            "data": {"dataset": "digits", "num_clients": 4, "partition": "iid"},
            "model": {"name": "mlp", "hidden": [16]},
            "training": training,
            "history": {"policy": policy},
        },
        "test",
    )


def _scalars(run: Path) -> dict[int, dict]:
    with HistoryStore.open(run / "history") as store:
        return {r: store.round_scalars(r) for r in store.rounds()}


def _final(run: Path) -> torch.Tensor:
    with HistoryStore.open(run / "history") as store:
        return store.read_model(store.last_round() or 0)


def test_every_third_round_measures_rounds_3_6_and_the_last_and_trains_the_same_model(tmp_path):
    train_run(_config(None), tmp_path / "every")
    train_run(_config(3), tmp_path / "third")

    every, third = _scalars(tmp_path / "every"), _scalars(tmp_path / "third")
    measured = sorted(r for r, s in third.items() if "test_accuracy" in s)
    assert measured == [0, 3, 6, 7]
    assert sorted(r for r, s in every.items() if "test_accuracy" in s) == list(range(8))
    for r in measured:
        assert third[r]["test_accuracy"] == every[r]["test_accuracy"]
        assert third[r]["test_loss"] == every[r]["test_loss"]
    assert all("train_loss" in third[r] for r in range(1, 8))
    assert torch.equal(_final(tmp_path / "third"), _final(tmp_path / "every"))


def test_the_server_loss_a_policy_reads_is_measured_every_round(tmp_path):
    train_run(_config(2, policy="fedadp"), tmp_path / "run")

    scalars = _scalars(tmp_path / "run")
    assert [r for r in range(1, 8) if CLIENTS_LOSS_KEY not in scalars[r]] == []
    assert sorted(r for r, s in scalars.items() if "test_accuracy" in s) == [0, 2, 4, 6, 7]


def test_the_default_leaves_the_dump_and_the_fingerprint_of_earlier_runs_unchanged():
    default, explicit = _config(None), _config(1)

    assert "eval_every" not in default.model_dump(mode="json")["training"]
    assert run_fingerprint(explicit) == run_fingerprint(default)
    assert _config(5).model_dump(mode="json")["training"]["eval_every"] == 5
    assert run_fingerprint(_config(5)) != run_fingerprint(default)


@pytest.mark.parametrize("value", [0, -1])
def test_a_cadence_below_one_is_refused(value):
    with pytest.raises(ConfigError, match="training.eval_every"):
        _config(value)


def test_a_sharded_runs_ensemble_follows_the_cadence(tmp_path, monkeypatch):
    # review finding: the ensemble's test pass (one per shard) ran every round
    from fedunlearn.runs.setup import Setup

    calls: list[int] = []
    ensemble = Setup.ensemble_metrics

    def counted(self, shard_params):
        calls.append(1)
        return ensemble(self, shard_params)

    monkeypatch.setattr(Setup, "ensemble_metrics", counted)
    data = _config(3).model_dump(mode="json")
    data["data"]["num_clients"] = 8
    data["training"]["shards"] = 2
    train_run(parse_config(data, "test"), tmp_path / "run")

    scalars = _scalars(tmp_path / "run")
    assert len(calls) == 3
    assert sorted(r for r, s in scalars.items() if "ensemble_test_accuracy" in s) == [3, 6, 7]
    assert sorted(r for r, s in scalars.items() if "test_accuracy" in s) == [0, 3, 6, 7]


def test_a_resume_with_another_cadence_names_both_values():
    # review finding: the default is left out of the dump, so the difference read "None vs 3"
    from fedunlearn.runs.rundir import config_differences

    assert config_differences(_config(None), _config(3)) == "training.eval_every: 1 vs 3"


def test_exporting_an_unmeasured_round_says_it_has_no_test_metrics(tmp_path):
    # review finding: the model's metadata silently held train_loss only
    from fedunlearn.cli.export import export_round

    train_run(_config(3), tmp_path / "run")

    unmeasured = export_round(tmp_path / "run", tmp_path / "r2.safetensors", 2)
    measured = export_round(tmp_path / "run", tmp_path / "r3.safetensors", 3)
    assert unmeasured["note"].startswith("round 2 has no test metrics")
    assert "note" not in measured
