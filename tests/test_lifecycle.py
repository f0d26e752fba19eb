"""A living run (runs/apply.py, runs/continuation.py, unlearn/session.py): apply, continue."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError, UnsupportedHistoryError
from fedunlearn.experiments import save_for_apply, unlearn_one
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import (
    apply_model,
    apply_result,
    continue_run,
    forget_clients,
    run_info,
    train_run,
)
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

SMALL = {
    "seed": 1,
    "data": {"dataset": "digits", "num_clients": 6},
    "model": {"name": "mlp", "hidden": [16]},
    "training": {"rounds": 4, "local_epochs": 1, "lr": 0.3, "batch_size": 32, "executor": "serial"},
    "history": {"policy": "all"},
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("lifecycle") / "run"
    train_run(parse_config(SMALL), run)
    return run


def copy_run(src, tmp_path, name="run"):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def unlearn_to_file(run, forget, method, out):
    result, summary = unlearn_one(run, forget, method, verify=False)
    save_for_apply(out, summary, result)
    out.write_text(json.dumps(summary))
    return result, summary


def test_a_forgotten_client_is_forgotten_again_by_every_later_request(trained, tmp_path):
    """Issue 22: after 'forget 0', a request for client 5 treated client 0 as remaining."""
    run = copy_run(trained, tmp_path)
    forget_clients(run, [0])

    with UnlearnSession(run) as session:
        request = session.cumulative(UnlearnRequest.of([5]))
        summary = session.request_summary(request)
        context = session.context(UnlearnRequest.of([5]))
        alone = session.run(make_method("retrain"), UnlearnRequest.of([5]))
        both = session.run(make_method("retrain"), UnlearnRequest.of([0, 5]))

    assert request.forget == {0, 5}
    assert summary == {"forget": [0, 5], "new": [0, 5], "earlier": [], "kind": "forget"}
    assert 0 not in context.clients.client_ids
    assert 5 not in context.clients.client_ids
    assert torch.equal(alone.params, both.params)  # Retrain retrains without both


def test_apply_then_continue_trains_without_the_forgotten_clients(trained, tmp_path):
    run = copy_run(trained, tmp_path)
    result, summary = unlearn_to_file(run, [2], "retrain", tmp_path / "r2.json")

    event = apply_result(run, tmp_path / "r2.json")
    again = apply_result(run, tmp_path / "r2.json")  # a re-run: nothing left to do
    done = continue_run(run, 3)

    assert summary["apply"]["trajectory_rounds"] == 4
    assert event["kind"] == "trajectory"
    assert again["already_applied"]
    assert again["generation"] == event["generation"] == 1
    assert done["from_round"] == 4
    assert done["target"] == 7
    assert done["forgotten_clients"] == [2]
    with HistoryStore.open(run / "history") as store:
        assert torch.equal(store.read_model(4), result.params)  # the applied model
        for r in range(1, 8):
            assert 2 not in {c.client_id for c in store.client_records(r)}
        assert store.last_round() == 7
    info = run_info(run)
    assert info["complete"]
    assert info["rounds_planned"] == 7
    assert info["generation"] == 1
    assert [e["forget"] for e in info["events"]] == [[2]]
    with UnlearnSession(run) as session:
        assert session.run_view.num_rounds == 7
        assert session.run_view.applied == {2}
        with pytest.raises(ConfigError, match="nothing new to forget"):
            session.cumulative(UnlearnRequest.of([2]))
        request = session.cumulative(UnlearnRequest.of([4]))
        assert session.request_summary(request)["earlier"] == [2]
        nobody = UnlearnRequest.of([])  # the current model; client 2 is still never asked
        assert 2 not in session.context(nobody).clients.client_ids
        kept = session.run(make_method("fedrecover"), nobody).params
        assert torch.equal(kept, session.run_view.final_params)
        result = session.run(make_method("fedrecover"), UnlearnRequest.of([4]))
        assert result.trajectory is not None
        assert len(result.trajectory.rounds) == 7


def test_apply_refuses_a_stale_result_and_a_changed_file(trained, tmp_path):
    run = copy_run(trained, tmp_path)
    unlearn_to_file(run, [1], "retrain", tmp_path / "a.json")
    unlearn_to_file(run, [3], "retrain", tmp_path / "b.json")
    apply_result(run, tmp_path / "a.json")

    with pytest.raises(ConfigError, match="computed on generation 0 at round 4"):
        apply_result(run, tmp_path / "b.json")
    data = (tmp_path / "b.apply.safetensors").read_bytes()
    (tmp_path / "b.apply.safetensors").write_bytes(data[:-4] + b"\x00\x00\x00\x01")
    with pytest.raises(ConfigError, match="does not match"):
        apply_result(run, tmp_path / "b.json")
    with HistoryStore.open(run / "history") as store:
        assert store.generation() == 1
        assert store.applied_clients() == {1}


def test_a_model_only_apply_leaves_retrain_as_the_method_that_serves(trained, tmp_path):
    run = copy_run(trained, tmp_path)
    result, summary = unlearn_one(run, [1], "fedadp", verify=False)
    save_for_apply(tmp_path / "f.json", summary, result)
    (tmp_path / "f.json").write_text(json.dumps(summary))
    assert result.trajectory is None

    event = apply_result(run, tmp_path / "f.json")

    assert event["kind"] == "model"
    assert event["rounds_after"] == 5
    with UnlearnSession(run) as session:
        with pytest.raises(UnsupportedHistoryError, match="use retrain"):
            session.run(make_method("fedrecover"), UnlearnRequest.of([4]))
        retrained = session.run(make_method("retrain"), UnlearnRequest.of([4]))
    assert retrained.costs.client_epochs > 0
    assert torch.isfinite(retrained.params).all()


def test_continue_refuses_another_round_count_while_one_is_unfinished(trained, tmp_path):
    run = copy_run(trained, tmp_path)
    with HistoryStore.open(run / "history", writable=True) as store:
        store.update_meta({"continuation": {"from": 4, "rounds": 5, "target": 9}})
    with pytest.raises(ConfigError, match="re-run it with --to-round 9 .or --rounds 5"):
        continue_run(run, 2)
    with pytest.raises(ConfigError, match="instead of --resume"):  # the config's run no more
        train_run(parse_config(SMALL), run, resume=True)


@pytest.mark.slow
def test_kill_9_during_continue_then_the_same_command_gives_the_uninterrupted_run(
    trained, tmp_path
):
    full = copy_run(trained, tmp_path, "full")
    unlearn_to_file(full, [0], "retrain", tmp_path / "r.json")
    apply_result(full, tmp_path / "r.json")
    cut = copy_run(full, tmp_path, "cut")
    continue_run(full, 6)
    cmd = [sys.executable, "-m", "fedunlearn.cli.main", "train", "--continue", str(cut)]

    child = subprocess.Popen([*cmd, "--rounds", "6", "--json"], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with HistoryStore.open(cut / "history") as store:
            if (store.last_round() or 0) >= 6:  # two new rounds committed
                break
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    with HistoryStore.open(cut / "history") as store:
        assert 6 <= store.last_round() < 10  # killed mid-continuation
    subprocess.run([*cmd, "--rounds", "6", "--json"], check=True, stdout=subprocess.DEVNULL)

    with HistoryStore.open(full / "history") as a, HistoryStore.open(cut / "history") as b:
        assert a.rounds() == b.rounds() == list(range(11))
        for r in range(11):
            assert torch.equal(a.read_model(r), b.read_model(r))
        for r in range(5, 11):
            assert dict(a.iter_updates(r)).keys() == dict(b.iter_updates(r)).keys()
    assert (full / "metrics.jsonl").read_text().count("\n") == 10
    assert (cut / "metrics.jsonl").read_text().count("\n") == 10


def test_a_model_made_elsewhere_is_applied_as_the_next_round_and_forget_then_erases(
    trained, tmp_path
):
    run = copy_run(trained, tmp_path)
    with HistoryStore.open(run / "history") as store:
        outside = store.read_model(0) + 0.5

    event = apply_model(run, outside, [3], method="external")
    record = forget_clients(run, [3])  # what apply did not erase: its stored updates

    assert event["kind"] == "model"
    assert event["forget"] == [3]
    assert event["rounds_after"] == 5
    assert len(record.payloads) == 4  # client 3's updates of rounds 1..4
    with HistoryStore.open(run / "history") as store:
        assert torch.equal(store.read_model(5), outside)
        assert store.check_deletions([3]).ok
    with pytest.raises(ConfigError, match="nothing new to forget"):
        apply_model(run, outside, [3])
    with pytest.raises(ConfigError, match="has 7 parameters"):
        apply_model(run, torch.zeros(7), [4])


_KILLED_CLI_APPLY = """
import os, signal, sys
from fedunlearn.history.store.events import Generations
inserted = Generations._insert_round
def insert_then_die(self, entry, now):
    inserted(self, entry, now)
    if entry.round == 2:  # inside the apply's one transaction
        os.kill(os.getpid(), signal.SIGKILL)
Generations._insert_round = insert_then_die
from fedunlearn.cli.main import main
sys.argv = ["fedunlearn", "apply", sys.argv[1], "--result", sys.argv[2]]
main()
"""


@pytest.mark.slow
def test_kill_9_inside_fedunlearn_apply_then_the_same_command_equals_an_uninterrupted_apply(
    trained, tmp_path
):
    full = copy_run(trained, tmp_path, "full")
    unlearn_to_file(full, [1], "fedrecover", tmp_path / "r.json")
    cut = copy_run(full, tmp_path, "cut")
    twin = tmp_path / "twin"  # apply consumes its file: the uninterrupted apply gets a copy
    twin.mkdir()
    for name in ("r.json", "r.apply.safetensors"):
        shutil.copy(tmp_path / name, twin / name)
    apply_result(full, twin / "r.json")

    child = subprocess.run(
        [sys.executable, "-c", _KILLED_CLI_APPLY, str(cut), str(tmp_path / "r.json")],
        check=False,
    )
    assert child.returncode == -signal.SIGKILL
    with HistoryStore.open(cut / "history") as store:
        assert store.generation() == 0
        assert store.has_update(2, 1)
    cmd = [sys.executable, "-m", "fedunlearn.cli.main", "apply", str(cut), "--result"]
    subprocess.run([*cmd, str(tmp_path / "r.json")], check=True, capture_output=True)

    with HistoryStore.open(full / "history") as a, HistoryStore.open(cut / "history") as b:
        assert a.rounds() == b.rounds()
        assert a.stored_models() == b.stored_models()
        for r, kind in a.stored_models():
            assert torch.equal(a.read_model(r, kind), b.read_model(r, kind))
        for r in a.rounds()[1:]:
            ups_a, ups_b = dict(a.iter_updates(r)), dict(b.iter_updates(r))
            assert ups_a.keys() == ups_b.keys()
            assert all(torch.equal(ups_a[c], ups_b[c]) for c in ups_a)
        assert [e.forget for e in a.events()] == [e.forget for e in b.events()] == [(1,)]
        assert b.check_deletions([1]).ok
    assert (full / "metrics.jsonl").read_text() == (cut / "metrics.jsonl").read_text()
