"""The typed record of a store's metadata (``history.store.metadata``): old, newer, bad values."""

from __future__ import annotations

import json

import pytest
import torch
from tests.support.faults import small_config
from typer.testing import CliRunner

from fedunlearn.errors import HistoryCorruptError
from fedunlearn.history.store import (
    HistoryStore,
    RoundEntry,
    RunMeta,
    parse_run_meta,
    run_meta_of,
)
from fedunlearn.history.store.metadata import META_SCHEMA_VERSION

# what a run trained before the record existed wrote (runs.train's keys), no schema_version
OLD_RUN_META = {
    "config": {"training": {"rounds": 3, "shards": 1}},
    "malicious": [2],
    "num_params": 10,
    "client_sizes": {"0": 5, "1": 7, "2": 4},
    "history_policy": "all",
    "history_every": 1,
    "torch_threads": 2,
    "executor": "serial",
    "wall_seconds": 1.5,
}


def test_a_store_written_without_schema_version_reads_as_version_1(tmp_path):
    with HistoryStore.create(tmp_path, OLD_RUN_META) as store:
        store.update_meta({"rounds_target": 3, "dropped_models": [[1, "aggregate"], [1, "global"]]})
    with HistoryStore.open(tmp_path) as store:
        meta = store.run_meta
        raw = store.meta
    assert "schema_version" not in raw  # the file format is unchanged: writers write no version
    assert meta.schema_version == META_SCHEMA_VERSION == 1
    assert meta.rounds_target == 3
    assert meta.dropped_models == [(1, "aggregate"), (1, "global")]
    assert meta.sizes() == {0: 5, 1: 7, 2: 4}
    assert meta.malicious == [2]
    assert meta.training["shards"] == 1
    assert meta.continuation is None
    assert meta.clean_from_round is None
    assert meta.extra == {}


def test_a_newer_run_with_an_unknown_key_opens_and_keeps_it(tmp_path):
    newer = {**OLD_RUN_META, "schema_version": 2, "from_the_future": {"a": [1, 2]}}
    with HistoryStore.create(tmp_path, newer) as store:
        store.write_round(RoundEntry(round=0, global_model=torch.zeros(3)))
        store.update_meta({"wall_seconds": 2.5})  # a writer rewrites the whole object
    with HistoryStore.open(tmp_path) as store:
        meta = store.run_meta
        assert store.meta["from_the_future"] == {"a": [1, 2]}  # kept in the file
        assert store.meta_problem() is None
        assert store.policy == "all"
    assert meta.schema_version == 2
    assert meta.extra == {"from_the_future": {"a": [1, 2]}}
    assert meta.wall_seconds == 2.5


def test_the_continuation_record_reads_its_from_key():
    meta = parse_run_meta({"continuation": {"from": 2, "rounds": 3, "target": 5}})
    assert meta.continuation is not None
    assert meta.continuation.start == 2
    assert meta.continuation.to_dict() == {"from": 2, "rounds": 3, "target": 5}


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"rounds_target": "ten"}, "rounds_target"),
        ({"rounds_target": True}, "rounds_target"),  # a bool is no round number
        ({"client_sizes": {"0": "many"}}, "client_sizes.0"),
        ({"dropped_models": [[1]]}, "dropped_models.0.1"),
        ({"continuation": {"from": "x", "rounds": 1, "target": 2}}, "continuation.from"),
    ],
)
def test_a_wrong_typed_value_is_a_one_line_error_naming_the_key(tmp_path, values, key):
    with HistoryStore.create(tmp_path, OLD_RUN_META) as store:
        store.update_meta(values)
        with pytest.raises(HistoryCorruptError) as caught:
            _ = store.run_meta
    message = str(caught.value)
    assert "\n" not in message
    assert f"metadata key '{key}'" in message
    assert str(tmp_path) in message  # names the store's file


def test_forgotten_samples_of_a_wrong_type_name_the_key_not_a_value_error(tmp_path):
    # before the typed record: int("x") raised a bare ValueError from forgotten_samples()
    with HistoryStore.create(tmp_path, {"forgotten_samples": {"1": ["x"]}}) as store:
        with pytest.raises(HistoryCorruptError, match=r"key 'forgotten_samples\.1\.0'"):
            store.forgotten_samples()


def test_a_method_view_reads_the_same_record(tmp_path):
    class View:  # any HistoryReader: only ``meta``
        meta = {**OLD_RUN_META, "clean_from_round": 4}

    with HistoryStore.create(tmp_path, OLD_RUN_META) as store:
        assert run_meta_of(store) == store.run_meta
    view = run_meta_of(View())
    assert isinstance(view, RunMeta)
    assert view.clean_from_round == 4
    with pytest.raises(HistoryCorruptError, match="key 'clean_from_round'"):
        run_meta_of(type("Bad", (), {"meta": {"clean_from_round": "4"}})())


def test_planned_rounds_prefers_the_recorded_target():
    assert parse_run_meta({}).planned_rounds(7) == 7
    assert parse_run_meta({"rounds_target": 0}).planned_rounds(7) == 0
    assert parse_run_meta({"rounds_target": 9}).planned_rounds(None) == 9


@pytest.mark.slow
def test_cli_info_on_a_run_with_a_wrong_typed_target_exits_1_naming_the_key(tmp_path):
    # before the typed record: int("ten") raised a bare ValueError inside 'fedunlearn info'
    from fedunlearn.cli.main import app
    from fedunlearn.config import parse_config
    from fedunlearn.runs import train_run

    run = tmp_path / "run"
    train_run(parse_config(small_config(rounds=1)), run)
    with HistoryStore.open(run / "history", writable=True) as store:
        store.update_meta({"rounds_target": "ten"})
    result = CliRunner().invoke(app, ["info", str(run), "--json"])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if "rounds_target" in line]
    assert len(lines) == 1
    assert "metadata key 'rounds_target'" in lines[0]
    assert json.dumps("ten") in lines[0].replace("'", '"')
