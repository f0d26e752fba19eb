"""The costs ``fedunlearn unlearn`` prints agree with its result JSON (a user review).

Before: the "vs Retrain" savings were printed but not in the JSON; ``--reference retrain`` on an
exact method was dropped without a word; a 19 kB read printed as "0.0 MB of history read".
"""

from __future__ import annotations

import json

import pytest
from tests.experiments.test_check_receipt import RUN  # a tiny digits run, policy all
from tests.unlearn.deletion_ready.test_tv_exact import TV
from typer.testing import CliRunner

from fedunlearn.cli.main import app
from fedunlearn.cli.printing import human_bytes
from fedunlearn.config import parse_config
from fedunlearn.runs import train_run

runner = CliRunner()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cost-lines")
    train_run(parse_config(RUN), root / "fedavg")
    train_run(parse_config(TV), root / "tv")
    return root


def _unlearn(run, method, out, *extra):
    args = ["unlearn", str(run), "--forget", "1", "--method", method, "--out", str(out)]
    res = runner.invoke(app, [*args, "--no-apply-file", "--no-client-test", *extra])
    assert res.exit_code in (0, 1), res.output  # 1: a verdict short of removed
    return res, json.loads(out.read_text())


def test_the_savings_printed_against_retrain_are_the_jsons(runs, tmp_path):
    res, doc = _unlearn(runs / "fedavg", "federaser", tmp_path / "r.json", "--reference", "retrain")
    retrain, costs = doc["retrain"], doc["costs"]
    epochs = retrain["client_epochs"] / costs["client_epochs"]
    seconds = retrain["wall_seconds"] / costs["wall_seconds"]
    assert retrain["epoch_saving_vs_retrain"] == pytest.approx(epochs)
    assert retrain["time_saving_vs_retrain"] == pytest.approx(seconds)
    line = next(x for x in res.output.splitlines() if "vs Retrain in this run" in x)
    assert f"epochs saved {epochs:.2f}x" in line
    assert f"time saved {seconds:.2f}x" in line


def test_a_retrain_reference_an_exact_result_needs_not_is_said_not_dropped(runs, tmp_path):
    res, doc = _unlearn(runs / "tv", "tv_exact", tmp_path / "t.json", "--reference", "retrain")
    assert doc["lineage"]["kind"] == "exact"
    assert "retrain" not in doc
    assert "vs Retrain: not measured (the result's lineage is exact" in res.output


def test_a_small_read_is_printed_in_its_unit(runs, tmp_path):
    res, doc = _unlearn(runs / "tv", "tv_exact", tmp_path / "t.json")
    read = doc["costs"]["history_bytes_read"]
    assert 0 < read < 1e6
    assert f"{human_bytes(read)} of history read" in res.output
    assert "0.0 MB of history read" not in res.output


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, "-"), (0, "0 B"), (19_240, "19.2 kB"), (2_039_440, "2.04 MB"), (977.4e9, "977 GB")],
)
def test_human_bytes(value, text):
    assert human_bytes(value) == text


def test_applying_a_request_that_touched_no_round_says_no_round_was_replaced(runs, tmp_path):
    """A review: apply printed "rounds 9..8 replaced" for a tv_exact result that kept all 8."""
    import shutil

    from fedunlearn.unlearn import UnlearnRequest, UnlearnSession

    run = shutil.copytree(runs / "tv", tmp_path / "run")
    with UnlearnSession(run, evaluate=False) as session:
        context = session.context(UnlearnRequest.of([0]))
        never = [c for c in range(12) if context.first_drawn_round(frozenset({c})) is None]
    assert never, "the fixture's run draws every client"
    out = tmp_path / "r.json"
    args = ["unlearn", str(run), "--forget", str(never[0]), "--method", "tv_exact"]
    res = runner.invoke(app, [*args, "--out", str(out), "--no-client-test"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["apply", str(run), "--result", str(out)])
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    assert "no round replaced (rounds 1..8 kept" in said
    assert "rounds 9..8" not in said
