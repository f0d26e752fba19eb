"""A user's Flower app with ``Recording(strategy, context)``: settings, requests, quiet progress.

Issue 36's defects, each reproduced over ``OwnGrid`` (the user's ClientApp called in this
process): the local epochs recorded where the app keeps them (or refused), Flower's own metric
names measuring utility, a progress line per phase and round and the result's path, and the CLI
answering a Flower-recorded run with the command that serves it (``fedunlearn unlearn`` queues
the request, the app's next ``flwr run`` serves it), ``fedunlearn info`` saying so.
"""

from __future__ import annotations

import json
import logging

import pytest

pytest.importorskip(
    "flwr", reason='Flower is not installed; pip install -e ".[flower]" to run these tests'
)

import own_app_support as own  # noqa: E402
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord, RecordDict  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from test_flower_recording import NODES, OwnGrid, task_identity  # noqa: E402, F401
from typer.testing import CliRunner  # noqa: E402

from fedunlearn.cli.main import app as cli  # noqa: E402
from fedunlearn.errors import ConfigError  # noqa: E402
from fedunlearn.integrations.flower.recording import Recording  # noqa: E402
from fedunlearn.runs import load_run_config, run_info  # noqa: E402
from fedunlearn.runs.app_requests import REQUEST_FILE, queued_request  # noqa: E402


def context(run_id: int = 5, **run_config) -> Context:
    return Context(
        run_id=run_id, node_id=0, node_config={}, state=RecordDict(), run_config=run_config
    )


def flower_metrics(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """Flower's quickstart global_evaluate names its metrics accuracy and loss."""
    return MetricRecord({"accuracy": 0.75, "loss": 0.5})


def start(strategy: Recording, grid=None, rounds: int = 2, **config):
    net = own.tiny_net(own.INPUT_SHAPE, own.NUM_CLASSES)
    return strategy.start(
        grid or OwnGrid(NODES),
        ArrayRecord(net.state_dict()),
        num_rounds=rounds,
        train_config=ConfigRecord({"lr": 0.2, **config}),
        evaluate_fn=flower_metrics,
    )


def wrapped(ctx: Context, **kwargs) -> Recording:
    """The user's line: their FedAvg in Recording, with their context."""
    fedavg = FedAvg(fraction_evaluate=0.0, min_available_nodes=1, min_train_nodes=1)
    return Recording(fedavg, ctx, model=own.MODEL, input_shape=own.INPUT_SHAPE, **kwargs)


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDUNLEARN_RUNS", str(tmp_path / "runs"))
    return tmp_path / "runs" / "test_flower_app_requests"  # this module's package: the app


def test_local_epochs_come_from_the_run_config_where_the_quickstart_keeps_them(runs):
    """Before: 1 epoch was recorded when neither Recording nor the train config named them."""
    own.TRAINED.clear()
    start(wrapped(context(**{"local-epochs": 3})))
    run = runs / "5"
    assert load_run_config(run).training.local_epochs == 3
    assert load_run_config(run).training.lr == 0.2  # the train config's


def test_unknown_local_epochs_are_refused_in_one_line_before_any_round(runs):
    grid = OwnGrid(NODES)
    with pytest.raises(ConfigError, match="local epochs are unknown") as err:
        start(wrapped(context()), grid=grid)
    assert "\n" not in str(err.value)
    assert "local_epochs=N" in str(err.value)
    assert grid.sent == []
    assert not runs.exists()


def test_flower_metric_names_measure_utility_and_progress_is_logged(runs, caplog):
    """Before: utility 'unknown' (only test_accuracy was read) and no line for minutes."""
    start(wrapped(context(**{"local-epochs": 1})))
    run = runs / "5"
    from fedunlearn.runs.app_requests import AppRequest, queue_request

    queue_request(run, AppRequest((1,), "retrain"))
    caplog.set_level(logging.INFO, logger="flwr")
    own.TRAINED.clear()

    start(wrapped(context(run_id=6, **{"local-epochs": 1})))  # the app's next flwr run

    assert not (runs / "6").exists()
    assert queued_request(run) is None
    result = json.loads((run / "flower_retrain.json").read_text())
    assert result["test_accuracy"] == result["accuracy"] == 0.75
    assert result["test_loss"] == 0.5
    checks = {c["name"]: c for c in result["verification"]["checks"]}
    assert checks["utility"]["verdict"] == "pass"
    assert {cid for cid, _, _ in own.TRAINED} == {0, 2}
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fedunlearn:")]
    assert [line[:16] for line in lines if "/3]" in line] == ["fedunlearn: [1/3"] + [
        "fedunlearn: [2/3",
        "fedunlearn: [3/3",
    ]
    rounds = [line for line in lines if "retrain round" in line]
    assert len(rounds) == 2
    assert "2 of 2 client(s) trained" in rounds[-1]
    assert lines[-1].endswith(
        f"result written to {run / 'flower_retrain.json'} (model "
        f"{run / 'flower_retrain.safetensors'})"
    )


def test_the_cli_queues_a_flower_runs_request_and_names_the_command(runs):
    """Before: 'pass clients= ... to context() or run()', an answer for the Python API."""
    start(wrapped(context(**{"local-epochs": 1})))
    run = runs / "5"
    out = run / "forget2.json"

    said = CliRunner().invoke(
        cli, ["unlearn", str(run), "--forget", "2", "--method", "fedrecover", "--out", str(out)]
    )

    assert said.exit_code == 0, said.output
    assert "serve it now, from the app's directory: flwr run ." in said.output
    queued = queued_request(run)
    assert queued is not None
    assert queued.forget == (2,)
    assert queued.method == "fedrecover"
    assert queued.out == str(out.resolve())
    info = run_info(run)
    assert info["serving"]["queued"]["forget"] == [2]
    shown = CliRunner().invoke(cli, ["info", str(run)])
    assert "'flwr run .' serves it; queued: forget [2] with fedrecover" in shown.output
    again = CliRunner().invoke(
        cli, ["unlearn", str(run), "--forget", "1", "--method", "retrain", "--out", str(out)]
    )
    assert again.exit_code == 2
    assert "already queues a request" in again.output
    (run / REQUEST_FILE).unlink()
    for args, says in (
        (["--forget", "9", "--method", "retrain"], "not in this run"),
        (["--forget", "1", "--method", "nope"], "nope"),
    ):
        bad = CliRunner().invoke(cli, ["unlearn", str(run), *args, "--out", str(out)])
        assert bad.exit_code == 2, bad.output
        assert says in bad.output, bad.output
        assert not (run / REQUEST_FILE).exists()


def test_a_request_named_in_the_run_config_is_served_without_a_queue(runs, tmp_path):
    start(wrapped(context(**{"local-epochs": 1})))
    run = runs / "5"
    out = tmp_path / "by-keys.json"
    keys = {"unlearn-forget": "0", "unlearn-run-dir": str(run), "unlearn-out": str(out)}

    strategy = wrapped(context(run_id=9, **keys))
    result = start(strategy)

    assert json.loads(out.read_text())["request"]["forget"] == [0]
    assert strategy.served is not None
    assert strategy.served["method"] == "retrain"
    assert set(result.arrays.keys()) == set(own.tiny_net((8,), 3).state_dict())
    assert result.evaluate_metrics_serverapp[0]["accuracy"] == 0.75
