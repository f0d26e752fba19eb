"""``history.encoding: float16``: stored client updates in half the bytes (issue 35, item 5).

Global models and aggregates stay float32, so training, Retrain and every exact lineage are
unchanged; the methods that read stored updates (FedRecover, FedEraser, Crab's estimates) read
them back as float32 after a float16 round trip. The error that adds against float32 storage is
measured in benchmarks/bench_history_encoding.py (docs/performance.md).
"""

from __future__ import annotations

import pytest
import torch

from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError
from fedunlearn.history.policy import HistoryRecorder
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

RUN = {
    "seed": 3,
    "data": {"dataset": "digits", "num_clients": 4},
    "model": {"name": "logreg"},
    "training": {"rounds": 6, "local_epochs": 1, "lr": 0.3, "batch_size": 64},
    "history": {"policy": "all"},
}


METHODS = {"retrain": {}, "fedrecover": {"warmup_rounds": 1, "final_rounds": 1}}


def _with(encoding: str) -> dict:
    return {**RUN, "history": {**RUN["history"], "encoding": encoding}}


def test_the_default_leaves_the_configs_dump_as_it_was():
    assert "encoding" not in parse_config(RUN).model_dump(mode="json")["history"]
    assert parse_config(_with("float32")).model_dump() == parse_config(RUN).model_dump()
    half = parse_config(_with("float16"))
    assert half.history.encoding == "float16"
    assert half.model_dump(mode="json")["history"]["encoding"] == "float16"
    assert parse_config(half.model_dump(mode="json")).history.encoding == "float16"


def test_an_unknown_encoding_is_one_line():
    with pytest.raises(ConfigError) as err:
        parse_config(_with("int8"))
    assert "history.encoding" in str(err.value)
    assert "\n" not in str(err.value).strip()


def test_an_update_float16_cannot_hold_is_kept_as_it_is():
    recorder = HistoryRecorder(None, None, update_dtype=torch.float16)  # type: ignore[arg-type]
    small = torch.tensor([0.5, -1e-3, 3.0])
    huge = torch.tensor([1e6, 0.1, 0.0])  # a scaled attacker's update: inf in float16
    assert recorder._encode(small).dtype == torch.float16
    assert recorder._encode(huge).dtype == torch.float32
    assert torch.equal(recorder._encode(huge), huge)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("encoding")
    for encoding in ("float32", "float16"):
        train_run(parse_config(_with(encoding)), root / encoding)
    return root


def test_updates_take_half_the_bytes_and_read_back_as_float32(runs):
    with (
        HistoryStore.open(runs / "float32" / "history") as full,
        HistoryStore.open(runs / "float16" / "history") as half,
    ):
        assert half.run_meta.update_encoding == "float16"
        assert half.stored_bytes_by_kind()["update"] * 2 == full.stored_bytes_by_kind()["update"]
        # training is unchanged: the global models are the same bits
        for r in full.rounds():
            assert torch.equal(full.read_model(r), half.read_model(r))
        exact = full.read_update(2, 1)
        read = half.read_update(2, 1)
        assert read.dtype == torch.float32
        assert torch.equal(read, exact.to(torch.float16).to(torch.float32))
        assert not torch.equal(read, exact)  # it is a rounding, not a copy


def test_retrain_is_bit_identical_and_fedrecover_is_close(runs):
    request = UnlearnRequest.of([1])
    found = {}
    for encoding in ("float32", "float16"):
        with UnlearnSession(runs / encoding, evaluate=False) as session:
            found[encoding] = {
                name: session.run(make_method(name, params), request)
                for name, params in METHODS.items()
            }
    full, half = found["float32"], found["float16"]
    assert torch.equal(full["retrain"].params, half["retrain"].params)
    a, b = full["fedrecover"].params, half["fedrecover"].params
    assert not torch.equal(a, b)
    assert float((a - b).norm() / a.norm()) < 1e-3
    # the updates it read are counted at the bytes stored: 2 a value instead of 4
    read_full = full["fedrecover"].costs.history_bytes_read
    read_half = half["fedrecover"].costs.history_bytes_read
    assert read_half < read_full
