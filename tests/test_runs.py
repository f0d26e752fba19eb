import json
import time
import warnings

import pytest
import torch

from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError, HistoryError
from fedunlearn.history.store import HistoryStore, WriterLock
from fedunlearn.runs import build_setup, deletion_evidence, forget_clients, run_info, train_run
from fedunlearn.runs.run_files import store_dir

SMALL = {
    "seed": 1,
    "data": {"dataset": "digits", "num_clients": 6},
    "model": {"name": "mlp", "hidden": [32]},
    "training": {"rounds": 6, "local_epochs": 2, "lr": 0.3, "batch_size": 32, "executor": "serial"},
    "attack": {"kind": "backdoor", "num_malicious": 1, "trigger_size": 3},
    "history": {"policy": "all"},
}


class StopAt:
    def __init__(self, round_):
        self.round_ = round_

    def on_round_end(self, record):
        if record.round == self.round_:
            raise KeyboardInterrupt


@pytest.mark.slow
def test_digits_run_learns_records_history_and_summarises(tmp_path):
    cfg = parse_config({**SMALL, "training": {**SMALL["training"], "rounds": 12}})
    summary = train_run(cfg, tmp_path / "run")
    assert summary["final_metrics"]["test_accuracy"] > 0.85
    assert 0 <= summary["final_metrics"]["backdoor_asr"] <= 1
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x["round"] for x in lines] == list(range(1, 13))
    assert lines[-1]["test_accuracy"] > lines[0]["test_accuracy"]
    info = run_info(tmp_path / "run")
    assert info["complete"]
    assert info["rounds_completed"] == 12
    d = summary["num_params"]
    # policy 'all': 6 clients x 12 rounds of float32 deltas, plus 13 global models, 12 aggregates
    assert info["stored_bytes_by_kind"]["update"] == 6 * 12 * d * 4
    assert info["stored_bytes"] == (6 * 12 + 13 + 12) * d * 4
    assert len(info["malicious_clients"]) == 1


@pytest.mark.slow
def test_interrupted_run_resumes_to_the_bit_identical_model(tmp_path):
    cfg = parse_config(SMALL)
    train_run(cfg, tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, tmp_path / "cut", observers=[StopAt(3)])
    summary = train_run(cfg, tmp_path / "cut", resume=True)
    assert summary["resumed_from_round"] == 3
    with (
        HistoryStore.open(tmp_path / "full" / "history") as a,
        HistoryStore.open(tmp_path / "cut" / "history") as b,
    ):
        assert torch.equal(a.read_model(6), b.read_model(6))
        assert torch.equal(a.read_update(5, 0), b.read_update(5, 0))
    full = (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()
    cut = (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
    assert len(cut) == len(full) == 6
    assert cut == full  # every field of every round, num_accepted/num_rejected included
    assert json.loads(cut[0])["num_accepted"] == 6


def test_existing_run_dir_and_changed_config_are_refused(tmp_path):
    cfg = parse_config({**SMALL, "training": {**SMALL["training"], "rounds": 1}})
    train_run(cfg, tmp_path / "r")
    with pytest.raises(ConfigError, match="already holds a run"):
        train_run(cfg, tmp_path / "r")
    other = parse_config({**SMALL, "seed": 2, "training": {**SMALL["training"], "rounds": 1}})
    with pytest.raises(ConfigError, match="config differs"):
        train_run(other, tmp_path / "r", resume=True)
    with pytest.raises(ConfigError, match="no run to resume"):
        train_run(cfg, tmp_path / "nothing", resume=True)
    with pytest.raises(HistoryError, match="not a run directory"):
        run_info(tmp_path / "nothing")


def test_every_k_policy_stores_only_those_rounds(tmp_path):
    cfg = parse_config({**SMALL, "history": {"policy": "every", "every": 2}})
    train_run(cfg, tmp_path / "r")
    with HistoryStore.open(tmp_path / "r" / "history") as store:
        assert store.has_update(1, 0)
        assert not store.has_update(2, 0)
        assert store.has_update(3, 0)
        assert store.read_model(2).shape == store.read_model(0).shape


def test_backdoor_poisons_only_malicious_clients():
    setup = build_setup(parse_config(SMALL))
    (bad,) = setup.federation.malicious
    for cid, data in setup.federation.client_data.items():
        stamped = data.x[:, 0, -3:, -3:].eq(1).flatten(1).all(1)
        if cid == bad:
            assert stamped.float().mean() > 0.8
            assert data.y[stamped].eq(0).all()
        else:
            assert not stamped.any()
    setup.close()


class SlowRounds:
    """Observer making each round take at least ``seconds`` (a measurable wall time)."""

    def __init__(self, seconds):
        self.seconds = seconds

    def on_round_end(self, record):
        time.sleep(self.seconds)


@pytest.mark.slow
def test_resume_accumulates_wall_time_over_sessions(tmp_path):
    cfg = parse_config(SMALL)
    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, tmp_path / "r", observers=[SlowRounds(0.2), StopAt(3)])
    with HistoryStore.open(tmp_path / "r" / "history") as store:
        first = store.meta["wall_seconds"]
    assert first >= 0.4  # rounds 1 and 2 committed their time; round 3 was cut

    summary = train_run(cfg, tmp_path / "r", resume=True, observers=[SlowRounds(0.2)])

    assert summary["session_wall_seconds"] >= 0.6
    assert summary["wall_seconds"] >= first + summary["session_wall_seconds"] - 1e-6
    saved = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert saved["wall_seconds"] == summary["wall_seconds"]
    assert run_info(tmp_path / "r")["wall_seconds"] == pytest.approx(summary["wall_seconds"])


@pytest.mark.slow
def test_resume_runs_with_the_thread_count_the_run_was_trained_with(tmp_path):
    cfg = parse_config(SMALL)  # trained with 1 thread (conftest), resumed by a 2-thread process
    train_run(cfg, tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, tmp_path / "cut", observers=[StopAt(3)])
    torch.set_num_threads(2)
    try:
        with pytest.warns(UserWarning, match="trained with 1 torch intra-op threads.*uses 2"):
            summary = train_run(cfg, tmp_path / "cut", resume=True)
        assert torch.get_num_threads() == 2  # the caller's count is restored
    finally:
        torch.set_num_threads(1)

    assert summary["torch_threads"] == 1  # what the resumed rounds ran with
    with (
        HistoryStore.open(tmp_path / "full" / "history") as a,
        HistoryStore.open(tmp_path / "cut" / "history") as b,
    ):
        assert a.meta["torch_threads"] == b.meta["torch_threads"] == 1
        assert torch.equal(a.read_model(6), b.read_model(6))


def test_the_lock_is_taken_before_anything_is_written(tmp_path):
    cfg = parse_config({**SMALL, "training": {**SMALL["training"], "rounds": 1}})
    (tmp_path / "r" / "history").mkdir(parents=True)
    lock = WriterLock.acquire(tmp_path / "r" / "history")
    try:
        with pytest.raises(HistoryError, match="another writer holds"):
            train_run(cfg, tmp_path / "r")
    finally:
        lock.release()
    assert sorted(p.name for p in (tmp_path / "r").rglob("*")) == ["history", "history.lock"]

    train_run(cfg, tmp_path / "r")
    before = (tmp_path / "r" / "config.yaml").read_bytes()
    other = parse_config({**SMALL, "seed": 5, "training": {**SMALL["training"], "rounds": 1}})
    with pytest.raises(ConfigError, match="already holds a run"):
        train_run(other, tmp_path / "r")
    assert (tmp_path / "r" / "config.yaml").read_bytes() == before


def test_resume_rewrites_a_missing_config_yaml_from_the_store(tmp_path):
    cfg = parse_config(SMALL)
    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, tmp_path / "r", observers=[StopAt(2)])
    expected = (tmp_path / "r" / "config.yaml").read_text()
    (tmp_path / "r" / "config.yaml").unlink()
    assert "config.yaml is missing" in run_info(tmp_path / "r")["problems"][0]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_run(cfg, tmp_path / "r", resume=True)

    assert any("rewrote it from the store" in str(w.message) for w in caught)
    assert (tmp_path / "r" / "config.yaml").read_text() == expected
    assert run_info(tmp_path / "r")["problems"] == []


def test_deletion_evidence_is_json_ready_and_checks_the_files(tmp_path):
    cfg = parse_config({**SMALL, "model": {"name": "mlp", "hidden": [64]}})
    train_run(cfg, tmp_path / "r")
    with HistoryStore.open(tmp_path / "r" / "history") as store:
        size = store.stored_bytes_by_client()[2]

    record = forget_clients(tmp_path / "r", [2])
    evidence = json.loads(json.dumps(deletion_evidence(tmp_path / "r", [2, 4])))

    assert record.size_bytes == size
    assert evidence["ok"] is False  # client 4 was never forgotten
    assert evidence["forgotten"] == {"2": True, "4": False}
    (rec,) = evidence["records"]
    assert rec["client_ids"] == [2]
    assert [p["round"] for p in rec["payloads"]] == list(range(1, 7))
    assert rec["payloads"][0]["sha256"] == record.payloads[0].sha256
    check = evidence["check"]
    assert check["ok"]
    assert check["unreadable"] == 6
    assert check["fingerprints_found"] == 0
    assert deletion_evidence(tmp_path / "r", [2])["ok"] is True
    with pytest.raises(HistoryError, match="not a run directory"):
        deletion_evidence(tmp_path / "nothing", [2])


def test_forget_refuses_a_non_run_directory_with_the_run_files_error(tmp_path):
    # issue 38 (D39): forget had its own copy of run_files.store_dir, its message punctuated
    # differently; the two commands now give the one error
    with pytest.raises(HistoryError) as expected:
        store_dir(tmp_path)
    with pytest.raises(HistoryError) as got:
        deletion_evidence(tmp_path, [2])
    assert str(got.value) == str(expected.value)


@pytest.mark.slow
def test_after_forget_methods_that_read_round_models_refuse_and_retrain_serves(tmp_path):
    """forget() drops the models that would rebuild a deleted update; who can still serve."""
    from typer.testing import CliRunner

    from fedunlearn.cli.main import app
    from fedunlearn.errors import UnsupportedHistoryError
    from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

    cfg = parse_config({**SMALL, "model": {"name": "mlp", "hidden": [64]}})
    train_run(cfg, tmp_path / "r")

    out = CliRunner().invoke(app, ["forget", str(tmp_path / "r"), "--clients", "2"])
    evidence = deletion_evidence(tmp_path / "r", [2])

    assert out.exit_code == 0, out.output
    assert "dropped 6 aggregate model(s) (rounds 1..6); 5 global model(s) (rounds 1..5)" in (
        " ".join(out.stdout.split())
    )
    assert "methods that read round models now refuse this run" in " ".join(out.stdout.split())
    assert evidence["ok"] is True
    assert evidence["reconstructible"] == []
    assert evidence["page_scan"] == {
        "ran": True,
        "fragments_found": 0,
        "inconclusive_reason": None,
    }
    request = UnlearnRequest.of([2], "forget")
    with UnlearnSession(tmp_path / "r") as session:
        for name in ("fedrecover", "crab", "starfish"):
            with pytest.raises(UnsupportedHistoryError, match=f"{name} reads the global models"):
                session.run(make_method(name), request)
        for name in ("retrain", "federaser"):
            result = session.run(make_method(name), request)
            assert result.costs.client_epochs > 0
            assert torch.isfinite(result.params).all()
