"""``fedunlearn plan CONFIG`` and the deletion readiness of ``fedunlearn info`` (issue 32)."""

from __future__ import annotations

import json

import pytest
import yaml
from tests.unlearn.deletion_ready.test_tv_exact import TV  # the same run as tv_exact's tests
from typer.testing import CliRunner

from fedunlearn.cli.main import app
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs.plan import client_round_probability, expected_recomputed_rounds

runner = CliRunner()


def _write(tmp_path, config):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_plan_json_holds_the_planner_s_numbers(tmp_path):
    res = runner.invoke(app, ["plan", str(_write(tmp_path, TV)), "--json", "--requests", "3"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    q = client_round_probability(12, 2)  # K = round(0.2 x 12) = 2
    assert plan["draws_per_round"] == 2
    assert plan["client"]["round_probability"] == pytest.approx(q)
    assert plan["client"]["recompute_probability"] == pytest.approx(1 - (1 - q) ** 8)
    assert plan["client"]["expected_rounds"] == pytest.approx(expected_recomputed_rounds(q, 8))
    assert plan["rho_client"] == pytest.approx(2 * 8 / 12)
    assert plan["model_bytes"] == 650 * 4  # logreg on digits: 64 x 10 + 10 parameters
    assert len(plan["sequence"]["recompute_probabilities"]) == 3
    assert plan["batch"]["items"] == 10
    assert plan["tv_stable_client"] is None


def test_plan_prints_one_screen(tmp_path):
    res = runner.invoke(app, ["plan", str(_write(tmp_path, TV)), "--after-round", "4"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.strip().splitlines()
    assert len(lines) <= 20
    assert "M = 12 clients, K = 2 per round" in res.stdout
    assert "requests after round 4" in res.stdout
    q = client_round_probability(12, 2)
    client_row = next(line for line in lines if line.strip().startswith("1 client "))
    assert f"{1 - (1 - q) ** 4:.3f}" in client_row
    assert "break-even" in res.stdout


def test_plan_of_a_fraction_config_shows_the_tv_stable_figure_beside(tmp_path):
    config = {**TV, "training": {"rounds": 8, "participation": 0.25, "batch_size": 4}}
    res = runner.invoke(app, ["plan", str(_write(tmp_path, config)), "--json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert plan["sampling"] == "fraction"
    assert plan["client"]["round_probability"] == pytest.approx(3 / 12)  # ceil(0.25 x 12)
    assert plan["tv_stable_draws"] == 3
    assert plan["tv_stable_client"]["expected_rounds"] < plan["client"]["expected_rounds"]
    text = runner.invoke(app, ["plan", str(_write(tmp_path, config))]).stdout
    assert "1 client if tv_stable (K = 3)" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--after-round", "0"], "--after-round must be in 1..8"),
        (["--requests", "0"], "--requests must be >= 1"),
        (["--samples", "500"], "--samples 500 is not below"),
    ],
)
def test_plan_refuses_bad_options_in_one_line(tmp_path, args, message):
    res = runner.invoke(app, ["plan", str(_write(tmp_path, TV)), *args])
    assert res.exit_code == 2
    assert message in res.output


def test_plan_of_a_missing_config_exits_2(tmp_path):
    res = runner.invoke(app, ["plan", str(tmp_path / "nope.yaml")])
    assert res.exit_code == 2


@pytest.mark.slow
def test_info_shows_what_a_request_would_recompute_from_the_participation_index(tmp_path):
    run = tmp_path / "run"
    res = runner.invoke(app, ["train", str(_write(tmp_path, TV)), "--out", str(run), "--json"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["info", str(run), "--json"])
    readiness = json.loads(res.stdout)["deletion_readiness"]
    first: dict[int, int] = {}
    with HistoryStore.open(run / "history") as store:
        for t in range(1, 9):
            for record in store.client_records(t):
                first.setdefault(record.client_id, t)
    never = sorted(set(range(12)) - set(first))
    assert readiness["never_drawn"] == never
    assert readiness["first_drawn_round"] == {str(c): first.get(c) for c in range(12)}
    mean = sum(8 - f + 1 for f in first.values()) / 12
    assert readiness["mean_rounds_to_recompute"] == pytest.approx(mean)
    assert readiness["draws_per_client"] == pytest.approx(2 * 8 / 12)  # K draws every round
    predicted = expected_recomputed_rounds(client_round_probability(12, 2), 8)
    assert readiness["predicted"]["expected_rounds"] == pytest.approx(predicted)
    text = runner.invoke(app, ["info", str(run)]).stdout
    assert f"{len(never)} of 12 clients never drawn" in text
    assert f"planner: {predicted:.1f} rounds" in text


def test_plan_takes_data_dir_as_the_data_error_tells_it_to(tmp_path):
    """A user review: the missing-data error said "(CLI: --data-dir)", which plan lacked."""
    config = {**TV, "data": {"dataset": "mnist", "num_clients": 12}}
    res = runner.invoke(app, ["plan", str(_write(tmp_path, config)), "--data-dir", str(tmp_path)])
    assert res.exit_code == 2, res.output
    assert "No such option" not in res.output
    assert str(tmp_path) in res.output.replace("\n", "")  # the directory given is the one read


@pytest.mark.parametrize("batch", [12, 200])
def test_a_batch_of_the_whole_federation_is_refused_in_one_line(tmp_path, batch):
    """A user review: --batch 200 of 100 clients was clamped to 99 without a word."""
    res = runner.invoke(app, ["plan", str(_write(tmp_path, TV)), "--batch", str(batch)])
    assert res.exit_code == 2, res.output
    assert f"--batch {batch} must be below data.num_clients (12)" in res.output


def test_the_default_batch_fits_a_small_federation(tmp_path):
    config = {**TV, "data": {"dataset": "digits", "num_clients": 6}}
    res = runner.invoke(app, ["plan", str(_write(tmp_path, config)), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["batch"]["items"] == 5  # 10, at most M - 1


def test_too_many_samples_per_client_names_the_config_key(tmp_path):
    """A user review: the error named partition()'s parameter min_size, not the key written."""
    config = {**TV, "data": {"dataset": "digits", "num_clients": 12, "min_client_samples": 200}}
    res = runner.invoke(app, ["plan", str(_write(tmp_path, config))])
    assert res.exit_code == 2, res.output
    assert "data.min_client_samples 200 for 12 clients needs 2400" in res.output
    assert "min_size" not in res.output


def test_an_infeasible_dirichlet_split_names_the_config_keys(tmp_path):
    """The same review's words, found again in real use: the Dirichlet error named min_size."""
    data = {"dataset": "digits", "num_clients": 100, "partition": "dirichlet", "alpha": 0.5}
    config = {**TV, "data": {**data, "min_client_samples": 8}}
    res = runner.invoke(app, ["plan", str(_write(tmp_path, config))])
    assert res.exit_code == 2, res.output
    said = " ".join(res.output.split())
    assert "lower data.min_client_samples or data.num_clients" in said
    assert "min_size" not in said
