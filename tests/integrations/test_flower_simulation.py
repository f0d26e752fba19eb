"""Flower's Simulation Runtime under `flwr run`: the example app trains, a client fails, unlearning.

Each test runs `simulate`, which starts a Simulation Runtime SuperLink and submits the app with
`flwr run` (Flower's supported path), so these are the example app's CI runs; the example app's
train run is conftest's ``example_app_run``, its unlearning request ``example_app_unlearned``, both
shared with the Flower lifecycle test.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

pytest.importorskip(
    "flwr", reason='Flower is not installed; pip install -e ".[flower]" to run these tests'
)

from flower_support import assert_same_history, small_config, write_config  # noqa: E402

from fedunlearn.fl.aggregators import fedavg  # noqa: E402
from fedunlearn.history import HistoryStore  # noqa: E402
from fedunlearn.integrations.flower.bundle import MODULE, write_app  # noqa: E402
from fedunlearn.integrations.flower.server_app import FlowerJob  # noqa: E402
from fedunlearn.integrations.flower.simulation import simulate  # noqa: E402
from fedunlearn.models import get_flat_params, load_model  # noqa: E402
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method  # noqa: E402

pytestmark = pytest.mark.slow

FAILING_CLIENT, FAILING_ROUND = 1, 2

# The app module with a Flower client mod that crashes one client in one round.
FAILING_APP_MODULE = f"""
from pathlib import Path

from fedunlearn.integrations.flower.client_app import make_client_app
from fedunlearn.integrations.flower.server_app import make_app


def fail_once(message, context, call_next):
    if (
        message.metadata.message_type == "train"
        and int(context.node_config["partition-id"]) == {FAILING_CLIENT}
        and int(message.content["task"]["round"]) == {FAILING_ROUND}
    ):
        raise RuntimeError("simulated crash in the middle of local training")
    return call_next(message, context)


client_app = make_client_app([fail_once])
server_app = make_app(base_dir=Path(__file__).parent)
"""


def test_example_app_under_flwr_run_records_the_in_process_history(example_app_run):
    # Prepare, Execute (conftest.example_app_run): the committed example app under flwr run,
    # its run config overridden as a user would, and the same config trained in-process
    run = example_app_run

    # Assert
    assert run.info["status"] == "finished:completed"
    assert "DEPRECATED" not in run.info["log"]
    assert f"run directory {run.flower}" in run.info["log"]
    assert_same_history(run.inproc, run.flower, rounds=run.rounds)
    summary = json.loads((run.flower / "summary.json").read_text())
    assert summary["engine"] == "flower"
    assert summary["missing"] == {}
    metrics = (run.flower / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in metrics] == [1, 2]


def test_failing_client_is_recorded_missing_and_the_run_completes(tmp_path, flower_lock):
    # Prepare: the app with a client mod that crashes client 1 in round 2
    config = small_config(num_clients=3, rounds=3)
    path = write_config(config, tmp_path / "config.yaml")
    run_dir = tmp_path / "flower"
    app = write_app(tmp_path / "app")
    (app / f"{MODULE}.py").write_text(FAILING_APP_MODULE)

    # Execute
    simulate(FlowerJob(mode="train", run_dir=run_dir, config_path=path), 3, num_cpus=2, app_dir=app)

    # Assert: every round committed; the failing client is missing in its round only
    with HistoryStore.open(run_dir / "history") as store:
        assert store.rounds() == [0, 1, 2, 3]
        status = {c.client_id: c.status for c in store.client_records(FAILING_ROUND)}
        assert status == {0: "accepted", 1: "missing", 2: "accepted"}
        (missing,) = [c for c in store.client_records(FAILING_ROUND) if c.status == "missing"]
        assert "simulated crash" in (missing.reason or "")
        assert not store.has_update(FAILING_ROUND, FAILING_CLIENT)
        for r in (1, 3):
            assert {c.status for c in store.client_records(r)} == {"accepted"}
        # the round's aggregate is FedAvg over the clients that did contribute
        updates = dict(store.iter_updates(FAILING_ROUND))
        sizes = torch.tensor([float(store.meta["client_sizes"][str(c)]) for c in updates])
        expected = fedavg(torch.stack(list(updates.values())), sizes)
        torch.testing.assert_close(store.read_model(FAILING_ROUND, "aggregate"), expected)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert list(summary["missing"]) == [str(FAILING_ROUND)]

    # and recovery from this history replays round 2 without the missing client
    with UnlearnSession(run_dir) as session:
        result = session.run(make_method("federaser"), UnlearnRequest.of([0]))
    assert torch.isfinite(result.params).all()
    assert result.costs.client_participations == 2 * 1 + 1  # rounds 2 and 3, client 1 absent in 2


def test_unlearning_request_under_flwr_run_equals_in_process(
    tmp_path, example_app_run, example_app_unlearned
):
    # Prepare: a copy of the run recorded under flwr run; the method in-process as the reference
    done = example_app_unlearned
    run_dir = tmp_path / "run"
    shutil.copytree(example_app_run.flower, run_dir)
    request = UnlearnRequest.of(list(done.forget))
    with UnlearnSession(run_dir) as session:
        want = session.run(make_method(done.method), request)

    # Execute (conftest.example_app_unlearned, shared with the Flower lifecycle test): Retrain's
    # rounds go to the remaining clients through Flower. FedEraser's calibration under real
    # Flower processes is test_flower_deployment's request.
    out = done.result

    # Assert: the model file is a loadable module holding the in-process method's model
    summary = json.loads(out.read_text())
    assert summary["request"]["forget"] == list(done.forget)
    assert summary["model_file"] == str(out.with_suffix(".safetensors"))
    got = get_flat_params(load_model(out.with_suffix(".safetensors")))
    torch.testing.assert_close(got, want.params, atol=1e-6, rtol=0)
    assert summary["engine"] == "flower"
    assert summary["missing"] == {}
    assert summary["costs"]["client_participations"] == want.costs.client_participations
    assert summary["costs"]["client_epochs"] == want.costs.client_epochs
