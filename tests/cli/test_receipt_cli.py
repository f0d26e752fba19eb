"""``fedunlearn audit`` and the receipt options of ``unlearn``: output, exit codes, errors."""

import copy
import json

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from fedunlearn.cli.main import app
from fedunlearn.config import parse_config
from fedunlearn.history.store import HistoryStore
from fedunlearn.models.flat import set_flat_params
from fedunlearn.runs import build_setup, train_run

runner = CliRunner()


def text(output: str) -> str:
    """Return output with rich's line wrapping undone."""
    return " ".join(output.split())

RUN = {
    "seed": 5,
    "data": {"dataset": "digits", "num_clients": 5},
    "model": {"name": "mlp", "hidden": [16]},
    "training": {"rounds": 3, "local_epochs": 1, "lr": 0.3, "batch_size": 32, "executor": "serial"},
    "attack": {"kind": "backdoor", "num_malicious": 1, "trigger_size": 3},
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("audit") / "run"
    config = parse_config(RUN)
    train_run(config, out)
    with HistoryStore.open(out / "history") as store:
        final = store.read_model(config.training.rounds)
    files = tmp_path_factory.mktemp("models")
    torch.save(final, files / "flat.pt")
    setup = build_setup(config)
    model = copy.deepcopy(setup.model)
    setup.close()
    set_flat_params(model, final)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, files / "m.safetensors")
    torch.save(torch.zeros(7), files / "wrong.pt")
    return out, files


@pytest.mark.parametrize("name", ["flat.pt", "m.safetensors"])
def test_audit_of_the_original_model_fails_with_exit_code_1(run, name, tmp_path):
    run_dir, files = run
    res = runner.invoke(
        app,
        [
            "audit",
            str(run_dir),
            "--model",
            str(files / name),
            "--forget",
            "malicious",
            "--out",
            str(tmp_path / "receipt.json"),
        ],
    )
    assert res.exit_code == 1, res.output
    assert f"{name} (recover clients" in text(res.stdout)
    assert "FAIL" in res.stdout
    assert "the model is the original model, unchanged" in text(res.stdout)
    doc = json.loads((tmp_path / "receipt.json").read_text())
    assert doc["verification"]["verdict"] == "fail"
    assert doc["subject"] == name
    assert doc["measures"]["test_accuracy"] == doc["original"]["test_accuracy"]


def test_audit_refuses_bad_input_with_one_clear_line(run, tmp_path):
    run_dir, files = run
    cases = [
        (["--model", str(files / "wrong.pt"), "--forget", "1"], "holds a tensor of shape (7,)"),
        (["--model", str(tmp_path / "none.pt"), "--forget", "1"], "does not exist"),
        (["--model", str(files / "flat.pt")], "name the clients the model should have forgotten"),
        (["--model", str(files / "flat.pt"), "--forget", "9"], "client(s) 9 not in this run"),
        # --forget is read as every other command reads it (cli.common.parse_forget)
        (["--model", str(files / "flat.pt"), "--forget", "-1"], "client ids are >= 0; got -1"),
        (["--model", str(files / "flat.pt"), "--forget", ","], "--forget is empty"),
        (
            ["--model", str(files / "flat.pt"), "--forget", "1", "--threshold", "utility_fail=2"],
            "invalid verification thresholds: utility_fail",
        ),
        (
            ["--model", str(files / "flat.pt"), "--forget", "1", "--reference", "best"],
            "reference must be one of original, retrain",
        ),
    ]
    for args, fragment in cases:
        res = runner.invoke(app, ["audit", str(run_dir), *args])
        assert res.exit_code == 2, (args, res.output)
        assert fragment in text(res.output), res.output


def test_unlearn_prints_the_receipt_and_takes_a_thresholds_file(run, tmp_path):
    run_dir, _ = run
    limits = tmp_path / "limits.yaml"
    limits.write_text("utility_warn: 0.0\nutility_fail: 0.0\n")  # any drop at all fails
    res = runner.invoke(
        app,
        [
            "unlearn",
            str(run_dir),
            "--forget",
            "malicious",
            "--method",
            "random",
            "--param",
            "fraction=0.34",
            "--thresholds",
            str(limits),
            "--out",
            str(tmp_path / "r.json"),
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads((tmp_path / "r.json").read_text())
    receipt = out["verification"]
    assert receipt["thresholds"]["utility_fail"] == 0.0
    utility = next(c for c in receipt["checks"] if c["name"] == "utility")
    drop = utility["reference"]["original"] - utility["value"]
    assert utility["verdict"] == ("fail" if drop > 0 else "pass")
    assert "random verification:" in res.stdout
    assert "utility:" in text(res.stdout)
    bad = tmp_path / "bad.yaml"
    bad.write_text("- 1\n")
    res = runner.invoke(
        app,
        [
            "unlearn",
            str(run_dir),
            "--forget",
            "1",
            "--method",
            "retrain",
            "--thresholds",
            str(bad),
            "--out",
            str(tmp_path / "x.json"),
        ],
    )
    assert res.exit_code == 2
    assert "must be a YAML mapping" in text(res.output)
    assert not (tmp_path / "x.json").exists()


def test_unlearn_with_a_retrain_reference_judges_against_it(run, tmp_path):
    run_dir, _ = run
    res = runner.invoke(
        app,
        [
            "unlearn",
            str(run_dir),
            "--forget",
            "malicious",
            "--method",
            "retrain",
            "--reference",
            "retrain",
            "--out",
            str(tmp_path / "r.json"),
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads((tmp_path / "r.json").read_text())
    assert out["verification"]["references"] == ["original", "retrain"]
    assert out["verification"]["verdict"] == "pass"  # Retrain judged against itself
    assert out["retrain"]["client_epochs"] == out["costs"]["client_epochs"]
    distance = next(c for c in out["verification"]["checks"] if c["name"] == "distance")
    assert distance["verdict"] == "pass"
    assert distance["value"] == 0.0
