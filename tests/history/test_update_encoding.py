"""``history.encoding: float16``: stored client updates in half the bytes (issue 35, item 5).

Global models and aggregates stay float32, so training, Retrain and every exact lineage are
unchanged; the methods that read stored updates (FedRecover, FedEraser, Crab's estimates) read
them back as float32 after a float16 round trip. The error that adds against float32 storage is
measured in benchmarks/bench_history_encoding.py (docs/performance.md).

The recorder takes each client record's values (norm, ||.||_inf, the dot with the aggregate)
from the copy it stores, read back as float32, and marks the store so
(``records_of_stored_copy``): FedEraser's and Crab's calibration and FedRecover's tau pass take
them instead of reading the updates, for the same model bit for bit. A float16 run recorded
before the marker (records of the float32 deltas) still reads its updates. The metered history
counts each update at the bytes its payload takes as stored.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError
from fedunlearn.fl.records import ClientUpdate, RoundRecord
from fedunlearn.history.policy import (
    DOT_AGGREGATE_KEY,
    MAX_ABS_KEY,
    HistoryRecorder,
    RecordAll,
    encoding_meta,
)
from fedunlearn.history.store import HistoryStore, RoundEntry
from fedunlearn.runs import HISTORY_DIR, train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method
from fedunlearn.unlearn.context import CostMeter, MeteredHistory
from fedunlearn.unlearn.replay import recorded_norms, records_describe_stored_updates

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


def test_a_float16_runs_records_describe_its_updates_as_read_back(runs):
    """Issue 35/38: norm, ||.||_inf and the dot are those of the stored copy, bit for bit."""
    with HistoryStore.open(runs / "float16" / "history") as store:
        assert store.run_meta.records_of_stored_copy is True
        assert store.run_meta.records_describe_stored_updates
        checked = 0
        for r in store.rounds()[1:]:
            aggregate = store.read_model(r, "aggregate").to(torch.float64)
            for rec in store.client_records(r):
                read = store.read_update(r, rec.client_id)
                assert rec.norm == float(read.norm())
                assert rec.scalars[MAX_ABS_KEY] == float(read.abs().max())
                assert rec.scalars[DOT_AGGREGATE_KEY] == float(read.to(torch.float64) @ aggregate)
                checked += 1
        assert checked == 6 * 4


def test_a_float32_store_writes_no_marker_and_its_records_are_its_updates(runs):
    with HistoryStore.open(runs / "float32" / "history") as store:
        assert "records_of_stored_copy" not in store.meta
        assert store.run_meta.records_describe_stored_updates
        rec = store.client_records(3)[0]
        assert rec.norm == float(store.read_update(3, rec.client_id).norm())


def _without_marker(source, target):
    """A copy of a float16 run as a run recorded before the marker: the key is gone."""
    shutil.copytree(source, target)
    with HistoryStore.open(target / HISTORY_DIR, writable=True) as store:
        meta = {k: v for k, v in store.meta.items() if k != "records_of_stored_copy"}
        with store._transaction("simulating an old run"):
            store._put_meta(meta)
        assert store.meta_problem() is None
    return target


@pytest.fixture(scope="module")
def unmarked(runs, tmp_path_factory):
    return _without_marker(runs / "float16", tmp_path_factory.mktemp("unmarked") / "run")


def test_a_float16_store_without_the_marker_takes_the_read_path(runs, unmarked):
    request = UnlearnRequest.of([1])
    with UnlearnSession(unmarked, evaluate=False) as session:
        context = session.context(request)
        assert not records_describe_stored_updates(context)
        assert recorded_norms(context, 2) == {}
        _, maxima = make_method("fedrecover")._participants(context)
        assert maxima == {r: {} for r in range(1, 7)}  # tau reads every stored copy
    with UnlearnSession(runs / "float16", evaluate=False) as session:
        context = session.context(request)
        assert records_describe_stored_updates(context)
        assert set(recorded_norms(context, 2)) == {0, 1, 2, 3}
        _, maxima = make_method("fedrecover")._participants(context)
        assert all(set(m) == {0, 2, 3} for m in maxima.values())


@pytest.mark.slow  # six unlearning sessions on two small runs (about 4 s)
@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("federaser", {}),
        ("crab", {}),
        ("fedrecover", {"warmup_rounds": 1, "final_rounds": 1, "alpha": 0.001}),
    ],
)
def test_the_record_path_gives_the_read_paths_model_and_reads_less(runs, unmarked, method, params):
    request = UnlearnRequest.of([1])
    found = {}
    for name, run in (("records", runs / "float16"), ("reads", unmarked)):
        with UnlearnSession(run, evaluate=False) as session:
            found[name] = session.run(make_method(method, params), request)
    records, reads = found["records"], found["reads"]
    assert records.params.numpy().tobytes() == reads.params.numpy().tobytes()
    assert records.costs.client_epochs == reads.costs.client_epochs
    assert records.lineage is not None
    assert reads.lineage is not None
    assert records.lineage.to_dict() == reads.lineage.to_dict()
    assert records.costs.history_bytes_read < reads.costs.history_bytes_read


def test_the_meter_counts_the_bytes_each_update_takes_as_stored(tmp_path):
    """An update a float16 store keeps in float32 (a value beyond 65,504) is 4 bytes a value."""
    small = torch.tensor([0.1, -0.3, 0.7, 1.1])
    huge = torch.tensor([1e6, 0.1, 0.0, -2.0])  # a scaled attacker's update: inf in float16
    with HistoryStore.create(tmp_path, encoding_meta("float16")) as store:
        store.write_round(RoundEntry(0, global_model=torch.zeros(4)))
        recorder = HistoryRecorder(store, RecordAll(), update_dtype=torch.float16)
        aggregate = (small + huge) / 2
        recorder.on_round_end(
            RoundRecord(
                1,
                torch.zeros(4),
                aggregate,
                aggregate,
                (ClientUpdate(0, small, 10, 0.1), ClientUpdate(1, huge, 10, 0.1)),
            )
        )
        meter = CostMeter()
        history = MeteredHistory(store, meter)
        assert history.read_update(1, 0).dtype == torch.float32
        assert meter.costs.history_bytes_read == 4 * 2
        assert torch.equal(history.read_update(1, 1), huge)
        assert meter.costs.history_bytes_read == 4 * 2 + 4 * 4
        assert [c for c, _ in history.iter_updates(1)] == [0, 1]
        assert meter.costs.history_bytes_read == 2 * (4 * 2 + 4 * 4)
        # the kept float32 update's record is itself; the rounded one's is its float16 copy
        recs = {r.client_id: r for r in store.client_records(1)}
        assert recs[1].norm == float(huge.norm())
        assert recs[0].norm == float(small.half().float().norm()) != float(small.norm())
