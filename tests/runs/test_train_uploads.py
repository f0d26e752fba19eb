"""A run says how many client uploads it accepted (a user review).

Before: ``training.lr: 1e30`` made every upload non-finite; each was rejected with a log line,
and ``train`` ended with its usual table, exit 0, nothing saying the model never moved.
"""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from fedunlearn.cli.main import app

RUN = {
    "seed": 0,
    "data": {"dataset": "digits", "num_clients": 4},
    "model": {"name": "logreg"},
    "training": {"rounds": 2, "local_epochs": 1, "lr": 0.3, "batch_size": 64},
}


def _train(tmp_path, lr, model=RUN["model"]):
    path = tmp_path / "c.yaml"
    doc = {**RUN, "model": model, "training": {**RUN["training"], "lr": lr}}
    path.write_text(yaml.safe_dump(doc))
    res = CliRunner().invoke(app, ["train", str(path), "--out", str(tmp_path / "run")])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    return res, summary


def test_every_upload_accepted_is_counted(tmp_path):
    res, summary = _train(tmp_path, 0.3)
    assert res.exit_code == 0, res.output
    assert summary["uploads"] == {"accepted": 8, "rejected": 0, "missing": 0}
    assert "no client upload was accepted" not in res.output


def test_a_run_whose_every_upload_was_rejected_says_so(tmp_path):
    res, summary = _train(tmp_path, 1e30, {"name": "mlp", "hidden": [16]})
    assert res.exit_code == 0, res.output
    assert summary["uploads"] == {"accepted": 0, "rejected": 8, "missing": 0}
    assert "client uploads" in res.output
    assert "no client upload was accepted in any round" in " ".join(res.output.split())
