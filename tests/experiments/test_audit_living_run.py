"""Audit a living run (issue 33): the served model after ``apply`` is judged for every client.

The run's current model is the applied result: it no longer carries the forgotten clients'
influence, so it cannot be the checks' negative control. The receipt used to compare the
served model with itself and say ``remains`` ("still the original model").
"""

import json

import pytest
from tests.review.test_apply_file_leak import SMALL  # the lifecycle reviews' small run
from typer.testing import CliRunner

from fedunlearn.cli.main import app
from fedunlearn.config import parse_config
from fedunlearn.experiments import audit_model, save_for_apply, unlearn_one
from fedunlearn.runs import apply_result, train_run
from fedunlearn.unlearn import UnlearnSession

pytestmark = pytest.mark.slow


def test_the_served_model_after_apply_is_audited_for_every_forgotten_client(tmp_path):
    run = tmp_path / "run"
    train_run(parse_config(SMALL), run)
    result, summary = unlearn_one(run, [0], "retrain", verify=False)
    out = tmp_path / "r.json"
    save_for_apply(out, summary, result)
    out.write_text(json.dumps(summary))
    apply_result(run, out)
    with UnlearnSession(run) as session:
        served = session.run_view.final_params

    doc = audit_model(run, served)  # forget: the clients the run removed (client 0)

    receipt = doc["verification"]
    assert doc["request"]["forget"] == [0]
    assert receipt["influence"] == "not_shown"  # was "remains": the served model vs itself
    assert receipt["cost"]["client_epochs"] == 0
    assert "applied result" in receipt["cost"]["skipped"]
    influence = [c for c in receipt["checks"] if c["aspect"] == "influence"]
    assert {tuple(c["codes"]) for c in influence} == {("no_control",)}
    (entry,) = receipt["clients"]
    assert (entry["client"], entry["request"], entry["influence"]) == (0, "earlier", "not_shown")
    assert entry["removed_by"]["generation"] == 1
    assert entry["removed_by"]["method"] == "retrain"
    assert entry["store"]["status"] == "deleted"
    # with the result it was applied from: an exact lineage, removed by construction
    exact = audit_model(run, served, result=out)["verification"]
    assert exact["influence"] == "removed"
    res = CliRunner().invoke(app, ["audit", str(run), "--model", str(tmp_path / "m.pt")])
    assert res.exit_code == 2  # no such model file: bad input, one line
