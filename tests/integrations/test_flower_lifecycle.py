"""A living run on the Flower runtime: unlearn over the Grid, apply, continue over the Grid.

Fast tests hand the messages to fedunlearn's ClientApp in this process (``LocalGrid``, as in
test_flower_protocol.py) and compare with the in-process lifecycle (runs/lifecycle.py); the
slow one runs the example app under real ``flwr run`` processes (docs/lifecycle.md, "Flower").
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip(
    "flwr", reason='Flower is not installed; pip install -e ".[flower]" to run these tests'
)

from flower_support import small_config  # noqa: E402
from test_flower_protocol import NODES, LocalGrid, task_identity  # noqa: E402, F401

from fedunlearn import train_run  # noqa: E402
from fedunlearn.errors import ConfigError  # noqa: E402
from fedunlearn.experiments import save_for_apply, unlearn_one  # noqa: E402
from fedunlearn.history import HistoryStore  # noqa: E402
from fedunlearn.integrations.flower.server_app import (  # noqa: E402
    FlowerJob,
    continue_on_grid,
    train_on_grid,
    unlearn_on_grid,
)
from fedunlearn.runs import apply_result, continue_run  # noqa: E402

EXAMPLE_APP = Path(__file__).resolve().parents[2] / "examples" / "flower-app"
CLIENT_OF_NODE = NODES  # node id -> client id


def trained_clients(store: HistoryStore, rounds: range) -> dict[int, list[int]]:
    """Return ``{round: client ids with a client record}`` of ``rounds``."""
    return {r: sorted(c.client_id for c in store.client_records(r)) for r in rounds}


def unlearn_in_process(run: Path, forget: list[int], out: Path) -> dict:
    result, summary = unlearn_one(run, forget, "retrain", verify=False)
    save_for_apply(out, summary, result)
    out.write_text(json.dumps(summary))
    return summary


class CrashingGrid(LocalGrid):
    """A LocalGrid whose Flower run stops (the ServerApp dies) in one round's exchange."""

    def __init__(self, partitions: dict[int, int], crash_round: int) -> None:
        super().__init__(partitions)
        self.crash_round = crash_round

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if any(
            m.metadata.message_type == "train"
            and int(m.content["task"]["round"]) == self.crash_round
            for m in messages
        ):
            raise RuntimeError("the SuperLink went away")
        return super().send_and_receive(messages, timeout=timeout)


@pytest.mark.slow
def test_lifecycle_over_a_grid_equals_the_in_process_lifecycle(tmp_path):
    """Before: a Flower unlearn result held no apply file and the ServerApp had no continue."""
    # Prepare: the same run over the Grid and in-process (serial executor: bit-identical)
    config = small_config(num_clients=3, rounds=2)
    flower, inproc = tmp_path / "flower", tmp_path / "inproc"
    train_on_grid(LocalGrid(NODES), config, FlowerJob("train", flower, Path("/unused.yaml")))
    train_run(config, inproc)

    # Execute: unlearn client 0 over the Grid, apply, continue 2 rounds over the Grid
    r0 = tmp_path / "flower_r0.json"
    unlearn_on_grid(LocalGrid(NODES), FlowerJob("unlearn", flower, forget=(0,), result_path=r0))
    event = apply_result(flower, r0)
    grid = LocalGrid(NODES)
    summary = continue_on_grid(grid, FlowerJob("continue", flower, rounds=2))
    unlearn_in_process(inproc, [0], tmp_path / "inproc_r0.json")
    apply_result(inproc, tmp_path / "inproc_r0.json")
    continue_run(inproc, 2)

    # Assert: the apply used the Flower result's trajectory; client 0 got no train message
    assert event["forget"] == [0]
    assert event["rounds_after"] == 2
    trains = [(CLIENT_OF_NODE[node], ids) for node, kind, ids in grid.sent if kind == "train"]
    assert len(trains) == 2 * 2
    assert all(cid != 0 and ids == [cid] for cid, ids in trains)
    assert summary["engine"] == "flower"
    assert summary["target"] == 4
    assert summary["forgotten_clients"] == [0]
    assert summary["missing"] == {}
    with (
        HistoryStore.open(flower / "history") as got,
        HistoryStore.open(inproc / "history") as want,
    ):
        assert got.rounds() == want.rounds() == [0, 1, 2, 3, 4]
        assert trained_clients(got, range(1, 5)) == {r: [1, 2] for r in range(1, 5)}
        for r in range(5):
            assert torch.equal(got.read_model(r), want.read_model(r)), r
    assert json.loads((flower / "continue_summary.json").read_text())["target"] == 4

    # Execute: a second request, over the Grid
    r1 = tmp_path / "flower_r1.json"
    unlearn_on_grid(LocalGrid(NODES), FlowerJob("unlearn", flower, forget=(1,), result_path=r1))

    # Assert: cumulative (both forgotten, client 1 new), computed on the continued run
    doc = json.loads(r1.read_text())
    assert doc["request"] == {"forget": [0, 1], "new": [1], "earlier": [0], "kind": "forget"}
    assert doc["run"]["generation"] == 1
    assert doc["run"]["last_round"] == 4
    assert apply_result(flower, r1)["forget"] == [0, 1]


def test_interrupted_continuation_over_a_grid_is_refused_then_resumed(tmp_path):
    # Prepare: an applied run (client 2 forgotten) and an uninterrupted copy of it
    config = small_config(num_clients=3, rounds=2)
    base = tmp_path / "base"
    train_run(config, base)
    unlearn_in_process(base, [2], tmp_path / "r2.json")
    apply_result(base, tmp_path / "r2.json")
    whole = tmp_path / "whole"
    shutil.copytree(base, whole)
    continue_on_grid(LocalGrid(NODES), FlowerJob("continue", whole, rounds=3))

    # Execute: the ServerApp dies in round 4 of 2..5
    with pytest.raises(RuntimeError, match="went away"):
        continue_on_grid(CrashingGrid(NODES, crash_round=4), FlowerJob("continue", base, rounds=3))

    # Assert: another round count is refused, nothing trained; the same job resumes
    with HistoryStore.open(base / "history") as store:
        assert store.last_round() == 3
    with pytest.raises(ConfigError, match="interrupted --continue of 3 rounds"):
        continue_on_grid(LocalGrid(NODES), FlowerJob("continue", base, rounds=5))
    summary = continue_on_grid(LocalGrid(NODES), FlowerJob("continue", base, rounds=0))
    assert summary["resumed_from_round"] == 3
    assert summary["target"] == 5
    with (
        HistoryStore.open(base / "history") as got,
        HistoryStore.open(whole / "history") as want,
    ):
        assert got.rounds() == want.rounds() == list(range(6))
        for r in range(6):
            assert torch.equal(got.read_model(r), want.read_model(r)), r
        assert all(2 not in ids for ids in trained_clients(got, range(3, 6)).values())


@pytest.mark.slow
def test_a_client_that_does_not_reply_in_a_continuation_is_recorded_missing(tmp_path):
    # Prepare
    run = tmp_path / "run"
    train_run(small_config(num_clients=3, rounds=1), run)

    # Execute: client 1's SuperNode never answers a train message
    summary = continue_on_grid(LocalGrid(NODES, drop={1}), FlowerJob("continue", run, rounds=1))

    # Assert: the round is committed from clients 0 and 2; client 1 has a missing record
    assert list(summary["missing"]) == ["2"]
    assert "no reply" in summary["missing"]["2"]["1"]
    with HistoryStore.open(run / "history") as store:
        status = {c.client_id: c.status for c in store.client_records(2)}
        assert status == {0: "accepted", 1: "missing", 2: "accepted"}
        assert not store.has_update(2, 1)


def test_continue_job_round_trips_and_bad_rounds_are_named(tmp_path):
    job = FlowerJob(mode="continue", run_dir=tmp_path, rounds=4)
    assert FlowerJob.from_run_config(job.to_run_config()) == job
    with pytest.raises(ConfigError, match="rounds takes a whole number"):
        FlowerJob.from_run_config({"mode": "continue", "run-dir": "/r", "rounds": "ten"})
    with pytest.raises(ConfigError, match="a train job's rounds are its config's"):
        FlowerJob.from_run_config(
            {"mode": "train", "run-dir": "/r", "config-path": "/c.yaml", "rounds": 3}
        )
    with pytest.raises(ConfigError, match="got -1 in mode 'continue'"):
        FlowerJob(mode="continue", run_dir=tmp_path, rounds=-1)


@pytest.mark.slow
def test_lifecycle_under_flwr_run_never_trains_a_forgotten_client(
    tmp_path, example_app_run, example_app_unlearned, flower_lock
):
    """The docs' Flower lifecycle: real flwr run processes and the fedunlearn apply CLI."""
    from fedunlearn.integrations.flower.simulation import simulate

    # Prepare: the example app trained 3 clients for 2 rounds under flwr run, then client 0
    # forgotten over Flower (conftest's example_app_run and example_app_unlearned, shared with
    # test_flower_simulation); this test changes a copy
    assert (example_app_run.num_clients, example_app_run.rounds) == (3, 2)
    assert (example_app_unlearned.forget, example_app_unlearned.method) == ((0,), "retrain")
    run = tmp_path / "run"
    shutil.copytree(example_app_unlearned.run, run)

    def flower(job: FlowerJob) -> None:
        simulate(job, 3, num_cpus=2, app_dir=EXAMPLE_APP)

    # Execute: apply the request's result (CLI), continue 2 rounds over Flower
    applied = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedunlearn.cli.main",
            "apply",
            str(run),
            "--result",
            str(run / example_app_unlearned.result.name),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert applied.returncode == 0, applied.stderr
    flower(FlowerJob("continue", run, rounds=2))

    # Assert: client 0 trained in no round of the run as it is now (the applied trajectory's
    # rounds 1..2, the continued rounds 3..4)
    with HistoryStore.open(run / "history") as store:
        assert store.rounds() == [0, 1, 2, 3, 4]
        assert trained_clients(store, range(1, 5)) == {r: [1, 2] for r in range(1, 5)}
        assert store.forgotten_clients() == {0}

    # Execute: a second request (client 1), over Flower
    flower(FlowerJob("unlearn", run, method="retrain", forget=(1,), result_path=run / "r1.json"))

    # Assert: the request forgets both, client 1 is new, on the continued run
    doc = json.loads((run / "r1.json").read_text())
    assert doc["request"] == {"forget": [0, 1], "new": [1], "earlier": [0], "kind": "forget"}
    assert doc["run"]["last_round"] == 4
    assert doc["run"]["generation"] == 1
    assert doc["costs"]["client_participations"] == 4  # client 2 alone, rounds 1..4


@pytest.mark.slow
def test_dp_is_refused_over_the_grid_before_any_round(tmp_path):
    """The ClientApp trains without the DP mechanism: a DP config trained over Flower held a
    config saying DP, rounds that were not, and an empty ledger; now train and continue refuse."""
    from fedunlearn.config import parse_config

    doc = small_config(num_clients=3, rounds=1).model_dump(mode="json")
    doc["privacy"] = {"enabled": True, "mechanism": "dp_sgd", "clip_norm": 1.0}
    config = parse_config(doc)
    with pytest.raises(ConfigError, match="DP is not implemented over Flower"):
        train_on_grid(LocalGrid(NODES), config, FlowerJob("train", tmp_path / "f", Path("/u")))
    assert not (tmp_path / "f").exists()

    train_run(config, tmp_path / "inproc")  # in-process DP training, then over the Grid
    with pytest.raises(ConfigError, match="mode 'continue' refuses a DP run"):
        continue_on_grid(LocalGrid(NODES), FlowerJob("continue", tmp_path / "inproc", rounds=1))
    with HistoryStore.open(tmp_path / "inproc" / "history") as store:
        assert store.last_round() == 1
        assert "continuation" not in store.meta
