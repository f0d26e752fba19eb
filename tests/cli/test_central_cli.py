import json

import pytest
from typer.testing import CliRunner

from fedunlearn.cli.main import app

runner = CliRunner()


@pytest.mark.slow
def test_central_on_digits_writes_tables(tmp_path):
    out = tmp_path / "central"
    args = ["central", "--dataset", "digits", "--ratio", "0.05,0.10", "--batch-size", "64",
            "--passes", "2", "--max-train", "600", "--no-mia", "--out", str(out), "--json",
            "--methods", "original,replay,mini_unlearning,amnesiac"]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    labels = {r["label"] for r in doc["rows"]}
    assert "Original" in labels
    assert "Mini-Unl. k=T" in labels
    assert "DeltaGrad" not in labels
    full = [r for r in doc["rows"] if r["label"] == "Mini-Unl. k=T"]
    assert all(r["relative_dist"] < 0.1 for r in full)
    for name in ("results.json", "results.csv", "tables.md", "accuracy.png", "distance_vs_k.png"):
        assert (out / name).exists()
    assert "Table 1 analogue" in (out / "tables.md").read_text()


def test_central_rejects_unknown_method(tmp_path):
    res = runner.invoke(app, ["central", "--methods", "nope", "--out", str(tmp_path)])
    assert res.exit_code == 2
    assert "unknown central method" in res.output
