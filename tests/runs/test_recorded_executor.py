"""``training.executor: auto`` is resolved once, at training, and kept by the run.

A conv net's ``auto`` is ``pool`` with more than one CPU and ``serial`` with one, and the two
round differently: an auditor's 1-CPU replay of a 2-CPU run's Retrain failed bit for bit (the
review of check-receipt's replay). The store records the resolved kind; resume, continue and
unlearning sessions build with it.
"""

from __future__ import annotations

import torch

import fedunlearn.fl.device as fl_device
import fedunlearn.fl.executors as executors
from fedunlearn.config import parse_config
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import train_run
from fedunlearn.runs.setup import with_recorded_executor
from fedunlearn.unlearn import UnlearnSession

RUN = {
    "seed": 4,
    "data": {"dataset": "digits", "num_clients": 3},
    "model": {"name": "logreg"},
    "training": {"rounds": 1, "local_epochs": 1, "lr": 0.3, "batch_size": 64, "executor": "auto"},
    "history": {"policy": "all"},
}


def test_a_session_builds_with_the_executor_the_run_resolved(tmp_path, monkeypatch):
    monkeypatch.setattr(executors, "select_executor", lambda *a, **k: "serial")  # training box
    train_run(parse_config(RUN), tmp_path / "run")
    with HistoryStore.open(tmp_path / "run" / "history") as store:
        assert store.meta["executor"] == "serial"
    monkeypatch.setattr(executors, "select_executor", lambda *a, **k: "vectorized")  # auditor's
    with UnlearnSession(tmp_path / "run", evaluate=False) as session:
        assert session.federation is not None
        assert session.federation.executor.name == "serial"


def test_only_auto_is_pinned_and_only_to_a_known_kind():
    auto = parse_config(RUN)
    assert with_recorded_executor(auto, "pool").training.executor == "pool"
    assert with_recorded_executor(auto, None).training.executor == "auto"  # an older run
    assert with_recorded_executor(auto, "gpu-magic").training.executor == "auto"
    serial = parse_config({**RUN, "training": {**RUN["training"], "executor": "serial"}})
    assert with_recorded_executor(serial, "pool").training.executor == "serial"


def test_a_session_builds_on_the_device_the_run_resolved(tmp_path, monkeypatch):
    """A run trained on the CPU with ``device: auto`` unlearns on the CPU on a GPU machine too."""
    train_run(parse_config(RUN), tmp_path / "run")
    with HistoryStore.open(tmp_path / "run" / "history") as store:
        assert store.run_meta.device == "cpu"
    # the auditor's machine: 'auto' would pick its GPU
    monkeypatch.setattr(fl_device, "_has_cuda", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert str(fl_device.resolve_device("auto")) == "cuda:0"
    with UnlearnSession(tmp_path / "run", evaluate=False) as session:
        assert session.federation is not None
        assert str(session.federation.device) == "cpu"


def test_only_auto_is_pinned_and_only_to_a_device_this_machine_has():
    auto = parse_config(RUN)
    assert with_recorded_executor(auto, None, "cpu").training.device == "cpu"
    assert with_recorded_executor(auto, None, None).training.device == "auto"  # an older run
    if not torch.cuda.is_available():  # trained on a GPU this machine lacks: auto stays
        assert with_recorded_executor(auto, None, "cuda:0").training.device == "auto"
    cpu = parse_config({**RUN, "training": {**RUN["training"], "device": "cpu"}})
    assert with_recorded_executor(cpu, None, "cuda:0").training.device == "cpu"
