"""A Flower user's app, deletion-ready in three changed lines (issue 36).

The apps (``user_apps/``) are ours, written in the shape of Flower's own quickstarts: a PyTorch
MLP and a NumPy linear classifier on scikit-learn's digits; a committed diff makes each one
record its runs and serve unlearning requests. The fast tests count the diff's lines
and run the apps in this process (their ServerApp called with a Grid whose nodes are calls of
their ClientApp); the slow one runs the PyTorch app under ``flwr run`` on the Simulation
Runtime, as its user would: train, ``fedunlearn unlearn`` (which queues the request), ``flwr
run`` again (which serves it), with no traceback in any output.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "flwr", reason='Flower is not installed; pip install -e ".[flower]" to run these tests'
)
pytest.importorskip("sklearn", reason="the test apps' data are scikit-learn's digits")

import user_apps_support as qs  # noqa: E402
from flwr.app import Context, RecordDict  # noqa: E402
from test_flower_recording import OwnGrid, task_identity  # noqa: E402, F401
from typer.testing import CliRunner  # noqa: E402

from fedunlearn.cli.main import app as cli  # noqa: E402
from fedunlearn.history import HistoryStore  # noqa: E402
from fedunlearn.runs import run_info  # noqa: E402
from fedunlearn.runs.app_requests import REQUEST_FILE  # noqa: E402

NODES = 4


@pytest.mark.parametrize("app", sorted(qs.PACKAGES))
def test_the_diff_changes_at_most_three_lines_and_no_pyproject(app):
    diff = qs.diff_of(app).read_text()
    assert qs.changed_lines(diff) <= 3
    assert all(f.endswith(".py") for f in qs.changed_files(diff))  # pyproject.toml untouched


def test_changed_lines_counts_a_replacement_once_and_an_addition_once():
    diff = "@@ -1,2 +1,2 @@\n-a\n+b\n c\n@@ -9 +9,2 @@\n d\n+e\n"
    assert qs.changed_lines(diff) == 2


def grid_and_context(copy: Path, client, run_id: int) -> tuple[OwnGrid, Context]:
    config = qs.app_config(copy)
    nodes = {
        7_000 + 13 * i: {"partition-id": i, "num-partitions": NODES} for i in range(NODES)
    }  # random-looking node ids; the partition ids say who is who
    grid = OwnGrid(nodes, app=client.app, run_config=config)
    context = Context(
        run_id=run_id, node_id=0, node_config={}, state=RecordDict(), run_config=config
    )
    return grid, context


@pytest.mark.slow
def test_pytorch_app_records_and_serves_a_queued_request(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDUNLEARN_RUNS", str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)  # the app saves final_model.pt in its working directory
    copy = qs.deletion_ready_copy("pytorch_app", tmp_path / "app")
    server, client = qs.import_app(copy, "pytorch_app")
    try:
        grid, context = grid_and_context(copy, client, run_id=7)
        server.app(grid, context)  # train: the ServerApp as Flower calls it
        run = tmp_path / "runs" / "digits_torch" / "7"
        info = run_info(run)
        assert info["complete"]
        assert info["num_clients"] == NODES
        assert info["rounds_completed"] == 3
        assert info["model"] == "digits_torch.task:Net"  # found in the app: its arrays match
        assert info["serving"]["app"] == "digits_torch"
        with HistoryStore.open(run / "history") as store:
            config = store.meta["config"]["training"]
            assert config["local_epochs"] == 1
            assert config["batch_size"] == 16
            assert config["lr"] == 0.1  # the train config's "lr" (the run config: learning-rate)
            assert 0 <= store.round_scalars(3)["accuracy"] <= 1  # the app's evaluate_fn, recorded

        out = tmp_path / "forget1.json"
        said = CliRunner().invoke(
            cli,
            ["unlearn", str(run), "--forget", "1", "--method", "retrain", "--out", str(out)],
        )
        assert said.exit_code == 0, said.output
        assert "flwr run ." in said.output
        assert (run / REQUEST_FILE).exists()
        shown = CliRunner().invoke(cli, ["info", str(run)])
        assert "served by the Flower app 'digits_torch'" in shown.output

        grid, context = grid_and_context(copy, client, run_id=8)
        server.app(grid, context)  # the same app, unchanged command: it serves the request
    finally:
        qs.unload("pytorch_app")
    assert not (run / REQUEST_FILE).exists()  # served: dequeued
    assert not (tmp_path / "runs" / "digits_torch" / "8").exists()  # no training this time
    result = json.loads(out.read_text())
    assert result["request"]["forget"] == [1]
    checks = {c["name"]: c for c in result["verification"]["checks"]}
    # utility measured by the app's evaluate_fn ({"accuracy", "loss"}), not "unknown"
    assert result["test_accuracy"] == result["accuracy"] > 0.5  # chance: 0.1 (10 classes)
    assert checks["utility"]["verdict"] in ("pass", "warn")
    assert result["verification"]["influence"] == "removed"  # Retrain: by construction
    check = result["client_check"]["1"]
    assert not check["shown"]
    assert check["reason"].startswith("not provided")
    assert (tmp_path / "final_model.pt").exists()  # the app's own code saved the unlearned model


def test_numpy_app_records_its_arrays_and_serves_a_request(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDUNLEARN_RUNS", str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)
    copy = qs.deletion_ready_copy("numpy_app", tmp_path / "app")
    server, client = qs.import_app(copy, "numpy_app")
    try:
        grid, context = grid_and_context(copy, client, run_id=3)
        server.app(grid, context)
        run = tmp_path / "runs" / "digits_numpy" / "3"
        info = run_info(run)
        assert info["complete"]
        assert info["rounds_completed"] == 3
        assert info["model"].endswith("app_model:arrays_model")  # no model class: the arrays
        from fedunlearn.runs.app_requests import AppRequest, queue_request

        queue_request(run, AppRequest((2,), "retrain"))
        grid, context = grid_and_context(copy, client, run_id=4)
        server.app(grid, context)
    finally:
        qs.unload("numpy_app")
    result = json.loads((run / "flower_retrain.json").read_text())
    assert result["request"]["forget"] == [2]
    assert result["missing"] == {}
    assert result["costs"]["client_participations"] == 3 * (NODES - 1)
    import numpy as np
    import safetensors.numpy

    model = safetensors.numpy.load_file(result["model_file"])
    assert sorted(model) == ["0", "1"]  # the app's own arrays: weights and biases
    assert model["0"].shape == (64, 10)
    assert model["1"].shape == (10,)
    assert np.isfinite(model["0"]).all()
    assert np.abs(model["0"]).max() > 0
    final = np.load(tmp_path / "final_model.npz")  # the app saved the unlearned model
    for key in ("0", "1"):
        np.testing.assert_allclose(final[f"arr_{key}"], model[key], rtol=1e-6)


def test_numpy_app_without_the_diff_is_plain_flower_and_records_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDUNLEARN_RUNS", str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)
    copy = qs.deletion_ready_copy("numpy_app", tmp_path / "app", diff=False)
    server, client = qs.import_app(copy, "numpy_app")
    try:
        grid, context = grid_and_context(copy, client, run_id=3)
        server.app(grid, context)
    finally:
        qs.unload("numpy_app")
    assert not (tmp_path / "runs").exists()
    import numpy as np

    weights = np.load(tmp_path / "final_model.npz")
    assert weights["arr_0"].shape == (64, 10)
    assert np.abs(weights["arr_0"]).max() > 0


@pytest.mark.slow
def test_pytorch_app_under_flwr_run_prints_no_traceback(tmp_path, flower_lock, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the SuperLink's, so its ServerApp's: it saves final_model.pt
    from flower_support import flower_environment

    from fedunlearn.integrations.flower.simulation import flower_command, simulation_superlink

    copy = qs.deletion_ready_copy("pytorch_app", tmp_path / "app")
    env, port = flower_environment(tmp_path)
    env["FEDUNLEARN_RUNS"] = str(tmp_path / "runs")

    def flwr_run() -> str:
        done = subprocess.run(
            [flower_command("flwr"), "run", ".", "--stream"]
            + ["--federation-config", "num-supernodes=3", "--run-config", "num-server-rounds=2"],
            cwd=copy,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        text = done.stdout + done.stderr
        assert done.returncode == 0, text[-3000:]
        return text

    with simulation_superlink(env, port, tmp_path / "superlink.log"):
        trained = flwr_run()
        (run,) = (tmp_path / "runs" / "digits_torch").iterdir()
        queued = subprocess.run(
            [str(Path(sys.executable).parent / "fedunlearn"), "unlearn", str(run)]
            + ["--forget", "1", "--method", "retrain", "--out", str(run / "forget.json")],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert queued.returncode == 0, queued.stdout + queued.stderr
        served = flwr_run()
    for text in (trained, served, queued.stdout + queued.stderr):
        assert "Traceback" not in text, text[-4000:]
    assert "fedunlearn: recorded 2 round(s) of 3 client(s)" in trained
    assert "fedunlearn: [1/3] serving a request (queued)" in served
    assert "fedunlearn: retrain round 2 (the run has 2): 2 of 2 client(s)" in served  # per round
    assert f"result written to {run / 'forget.json'}" in served
    result = json.loads((run / "forget.json").read_text())
    assert 0 <= result["test_accuracy"] <= 1  # measured by the app's global_evaluate
    assert result["verification"]["influence"] == "removed"
