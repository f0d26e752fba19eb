"""Privacy statements that hold, on trained runs through the lifecycle (issue 40).

Each test reproduces one defect of the audit on a small run (digits, 6 clients, 3 rounds):
noise-free per-client losses in the DP history (1), the headline ε (5), a DP status taken from
the result file (3), data-driven choices of a DP release read from the forgotten client (4),
draws and statistics of the receipt's reference (6), and the clip-and-noise mechanism and
``dp_scope: store_only`` through the lifecycle (7).
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
from pathlib import Path

import dp_accounting
import pytest
from dp_accounting import pld
from tests.support.results import saved_result as _result
from typer.testing import CliRunner

from fedunlearn.cli.main import app
from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError
from fedunlearn.eval import ReceiptOptions, reference_retrain
from fedunlearn.experiments import unlearn_one
from fedunlearn.history.digest import seal
from fedunlearn.history.store import HistoryStore
from fedunlearn.privacy.accountant import calibrate_sampled_gaussian
from fedunlearn.privacy.calibrate import gradient_clip_norm
from fedunlearn.privacy.guarantees import RELEASED_STATISTICS, RESULT_STATISTICS
from fedunlearn.privacy.mechanisms import noise_multiplier
from fedunlearn.runs import apply_result, continue_run, forget_clients, run_info, train_run
from fedunlearn.runs.rundir import load_run_config
from fedunlearn.runs.setup import build_setup
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession

pytestmark = pytest.mark.slow  # each trains or unlearns a run (5-20 s on 2 cores)

BASE = {
    "seed": 2,
    "data": {"dataset": "digits", "num_clients": 6},
    "model": {"name": "mlp", "hidden": [16]},
    "training": {"rounds": 3, "local_epochs": 1, "lr": 0.3, "batch_size": 32, "executor": "serial"},
    "attack": {"kind": "backdoor", "num_malicious": 1, "trigger_size": 3},
    "history": {"policy": "all"},
}
PRIVACY = {
    "auto": {"enabled": True, "mechanism": "dp_sgd", "clip_norm": "auto"},
    "client_update": {"enabled": True, "mechanism": "client_update", "clip_norm": 0.5},
    "store_only": {
        "enabled": True,
        "mechanism": "client_update",
        "clip_norm": 0.5,
        "dp_scope": "store_only",
    },
}
# META: what a result says about itself and its computation (torch_threads), not a statistic of
# the run's data
META = {
    "schema_version",
    "method",
    "request",
    "run",
    "params",
    "privacy",
    "apply",
    "integrity",
    "torch_threads",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("statements")
    out = {}
    for name, privacy in PRIVACY.items():
        history = {"policy": "fedadp"} if name == "store_only" else BASE["history"]
        summary = train_run(
            parse_config({**BASE, "history": history, "privacy": privacy}), root / name
        )
        out[name] = (root / name, summary)
    return out


def _copy(runs, name, tmp_path):
    shutil.copytree(runs[name][0], tmp_path / name)
    return tmp_path / name


def _reseal(path, edit):
    """Edit a result JSON as an attacker with the code would: change it, then seal it again."""
    doc = json.loads(path.read_text())
    edit(doc)
    seal(doc, doc["run"])
    path.write_text(json.dumps(doc))


def _remaining_gradient_clip_norm(run, remaining):
    setup = build_setup(load_run_config(run))
    try:
        data = {c: setup.federation.client_data[c] for c in remaining}
        return gradient_clip_norm(setup.federation.model, setup.initial_params, data)[0]
    finally:
        setup.close()


def _dp_sgd_release_epsilon(run, forget, rounds, epsilon):
    """ε (PLD, replace-one) of ``rounds`` DP-SGD rounds of the remaining clients, directly."""
    with HistoryStore.open(run / "history") as store:
        sizes = [int(n) for c, n in store.meta["client_sizes"].items() if int(c) not in forget]
    q = max(min(1.0, 32 / n) for n in sizes)
    steps = max(math.ceil(n / 32) for n in sizes)  # E = 1
    sigma = calibrate_sampled_gaussian(q, steps, epsilon, 1e-5)
    step = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    acc = pld.PLDAccountant(
        value_discretization_interval=1e-3,
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE,
    )
    return acc.compose(dp_accounting.SelfComposedDpEvent(step, steps * rounds)).get_epsilon(1e-5)


def _gaussian_release_epsilon(rounds, epsilon):
    """ε (PLD) of ``rounds`` clip-and-noise releases at ε, replace one client: sensitivity 2S."""
    z = noise_multiplier(epsilon, 1e-5)
    acc = pld.PLDAccountant(value_discretization_interval=1e-3)
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z / 2), rounds)
    return acc.compose(event).get_epsilon(1e-5)


def test_a_dp_run_keeps_no_client_loss_and_forget_drops_every_value(runs, tmp_path):
    """Defect 1: each stored client record held the client's noise-free mean training loss
    (the backdoored one's stood out) and forget() left it, with the norm and <Δ_c, G_t>."""
    run = _copy(runs, "auto", tmp_path)
    with HistoryStore.open(run / "history") as store:
        records = [r for t in (1, 2, 3) for r in store.client_records(t)]
        scalars = [store.round_scalars(t) for t in (1, 2, 3)]
    assert len(records) == 18
    assert {r.loss for r in records} == {None}
    assert not any("train_loss" in sc for sc in scalars)
    assert all(r.norm is not None for r in records)  # post-processing of the DP upload

    forget_clients(run, [0])

    with HistoryStore.open(run / "history") as store:
        gone = [r for t in (1, 2, 3) for r in store.client_records(t) if r.client_id == 0]
        kept = [r for t in (1, 2, 3) for r in store.client_records(t) if r.client_id == 1]
    assert [(r.norm, r.loss, r.scalars) for r in gone] == [(None, None, {})] * 3
    assert all(r.norm is not None and "dot_aggregate" in r.scalars for r in kept)


def test_train_and_info_headline_the_a_priori_guarantee(runs):
    """Defect 5: train's summary and --json gave the realised, data-dependent ε only."""
    run, summary = runs["auto"]
    ledger = json.loads((run / "privacy.json").read_text())
    head = summary["privacy"]
    assert head["epsilon"] == ledger["epsilon_guarantee"]["pld_epsilon"]
    assert head["realised_epsilon"] == ledger["realised_epsilon"] < head["epsilon"]
    assert head["neighbour_relation"] == ledger["neighbour_relation"] == "replace_one"
    info = CliRunner().invoke(app, ["info", str(run)], terminal_width=250)
    assert info.exit_code == 0, info.output
    line = next(x for x in info.output.splitlines() if x.startswith("| privacy |"))
    assert f"guarantee eps {head['epsilon']:.3f}" in line
    assert line.index("guarantee eps") < line.index(f"realised {head['realised_epsilon']:.3f}")


def test_dp_retrain_fixes_its_budget_and_its_clip_norm_over_the_remaining_clients(runs):
    """Defect 4: DP Retrain kept the clip norm computed over every client ('auto') and the
    stored ε_t, which Eq. 4 chose from losses that included the forgotten client."""
    run, _ = runs["auto"]
    with HistoryStore.open(run / "history") as store:
        stored = store.round_scalars(1)["dp_clip_norm"]
    result, _ = unlearn_one(run, [0], "retrain", params={"dp": True}, verify=False)
    ledger = result.details.privacy["unlearning_privacy"]
    assert ledger["epsilon_per_round"] == [3.0] * 3  # ε_max, fixed a priori
    recomputed = _remaining_gradient_clip_norm(run, [1, 2, 3, 4, 5])
    assert ledger["clip_norm"] == pytest.approx(recomputed, rel=1e-12) != stored


def test_apply_derives_the_dp_status_and_epsilon_from_the_run_not_the_file(runs, tmp_path):
    """Defect 3: a hand-edited non-DP Retrain result (released_model_dp true, a small fresh ε)
    applied without --accept-non-dp, and the ledger then said 'current model: DP'."""
    run = _copy(runs, "auto", tmp_path)
    plain = _result(run, tmp_path, "retrain", "plain")

    def claim_dp(doc):
        doc["details"] = {
            "released_model_dp": True,
            "released_model_reason": "trust me",
            "privacy": {"unlearning_privacy": {"fresh_guarantee_epsilon": 0.01}},
        }

    _reseal(plain, claim_dp)
    with pytest.raises(ConfigError, match="is not DP"):
        apply_result(run, plain)

    released = _result(run, tmp_path, "retrain", "dp", dp=True)

    def small(doc):
        doc["details"]["privacy"]["unlearning_privacy"]["fresh_guarantee_epsilon"] = 0.01

    _reseal(released, small)
    apply_result(run, released)  # a DP release: no flag needed
    continue_run(run, 1)

    info = run_info(run)["privacy"]
    fresh = info["applied"][0]["fresh_epsilon"]
    assert fresh == pytest.approx(_dp_sgd_release_epsilon(run, {0}, 3, 3.0), rel=1e-3)
    assert fresh > 1.0  # the file's 0.01 was not read
    assert info["artefacts"]["current_model"]["dp"]
    # the continued round's 'auto' clip norm is the remaining clients' (defect 4)
    with HistoryStore.open(run / "history") as store:
        continued = store.round_scalars(4)["dp_clip_norm"]
    assert continued == pytest.approx(_remaining_gradient_clip_norm(run, [1, 2, 3, 4, 5]))


def test_the_receipt_reference_draws_noise_of_its_own(runs):
    """Defect 6: the receipt's DP Retrain reference re-drew the run's own noise (every noise
    seed equal to training's). Round 1 starts from M_0, so the reference's upload of a
    remaining client and the run's differ only by their noise: with the same standard normal
    draw the difference is |std_ref - std_run| ξ; with draws of its own, about
    sqrt(std_ref² + std_run²) in norm per coordinate."""
    run, _ = runs["client_update"]
    with UnlearnSession(run) as session:
        reference = reference_retrain(session, UnlearnRequest.of([0]), "retrain")
    with HistoryStore.open(run / "history") as store:
        original = store.read_update(1, 1)
        std_run = store.round_scalars(1)["dp_noise_std"]
    ours = reference.trajectory.rounds[0].updates[1]
    std_ref = 0.5 * noise_multiplier(3.0, 1e-5)  # S z at ε_max
    per_coordinate = float((ours - original).norm()) / math.sqrt(original.numel())
    assert per_coordinate == pytest.approx(math.hypot(std_ref, std_run), rel=0.05)
    assert abs(per_coordinate - abs(std_run - std_ref)) > 0.5 * abs(std_run - std_ref)


def test_a_result_lists_every_statistic_and_states_one_status_per_artefact(runs):
    """Defect 6: a DP release's JSON said released_model_dp true beside
    artefacts.unlearned_model.dp false, and published the reference's distance, accuracy and
    membership AUCs with no entry in released_statistics."""
    run, _ = runs["client_update"]
    # FedADP's DP release (its lineage is not exact: the receipt trains its DP Retrain reference)
    _, summary = unlearn_one(
        run,
        [0],
        "fedadp",
        params={"unlearn_dp": True},
        receipt=ReceiptOptions("retrain", client_test=False),
    )
    privacy = summary["privacy"]
    listed = privacy["released_statistics"]
    assert set(summary) - META <= set(listed), set(summary) - META - set(listed)
    assert {"verification", "retrain"} <= set(summary)  # the receipt's figures are listed
    names = {k.removeprefix("dp_") for m in summary["round_metrics"] for k in m if k != "round"}
    assert names <= set(listed), names - set(listed)
    assert listed == {**RELEASED_STATISTICS, **RESULT_STATISTICS}
    assert summary["details"]["released_model_dp"] is True
    assert privacy["artefacts"]["unlearned_model"]["dp"] is True


def test_clip_and_noise_goes_through_the_lifecycle(runs, tmp_path):
    """Defect 7: the client_update mechanism through DP Retrain, apply and a continuation."""
    run = _copy(runs, "client_update", tmp_path)
    path = _result(run, tmp_path, "retrain", "dp", dp=True)
    apply_result(run, path)
    continue_run(run, 1)
    info = run_info(run)["privacy"]
    fresh = info["applied"][0]["fresh_epsilon"]
    assert fresh == pytest.approx(_gaussian_release_epsilon(3, 3.0), rel=1e-3)
    g = info["epsilon_guarantee"]
    assert g["rounds"] == 4
    assert g["neighbour_relation"] == "replace_one"
    assert g["with_unlearning_releases"]["epsilon"] == pytest.approx(g["pld_epsilon"] + fresh)
    assert info["artefacts"]["current_model"]["dp"]
    assert info["artefacts"]["uploads"]["dp"]
    with HistoryStore.open(run / "history") as store:
        assert {r.loss for t in (1, 2, 3, 4) for r in store.client_records(t)} == {None}


def test_store_only_states_what_its_store_holds(runs, tmp_path):
    """Defect 7: under store_only the stored models are training's (clean uploads) and the
    client records kept the clean updates' norms, inner products and losses."""
    run = _copy(runs, "store_only", tmp_path)
    info = run_info(run)["privacy"]
    assert not info["artefacts"]["stored_history"]["dp"]
    assert not info["artefacts"]["uploads"]["dp"]
    assert not info["artefacts"]["original_model"]["dp"]
    with HistoryStore.open(run / "history") as store:
        records = [r for t in (1, 2, 3) for r in store.client_records(t)]
    assert [(r.norm, r.loss, "dot_aggregate" in r.scalars) for r in records] == [
        (None, None, False)
    ] * 18
    released = _result(run, tmp_path, "fedadp", "released", unlearn_dp=True)
    apply_result(run, released)  # a DP release: status and ε derived from the run
    after = run_info(run)["privacy"]
    replayed = json.loads(released.read_text())["details"]["privacy"]["unlearning_privacy"]
    assert after["applied"][0]["fresh_epsilon"] == pytest.approx(
        _gaussian_release_epsilon(replayed["replayed_rounds"], 3.0), rel=1e-3
    )


def _script():
    path = (
        Path(__file__).resolve().parents[2] / "reproductions" / "fedadp" / "recompute_epsilons.py"
    )
    spec = importlib.util.spec_from_file_location("recompute_epsilons", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_stated_epsilon_recomputes_with_dp_accounting(runs, capsys, monkeypatch):
    """Done when: a script recomputes every stated ε of the DP examples (the example config's
    and the docs' figures, and a run's privacy.json) with dp-accounting, in the slow tests."""
    script = _script()
    dirs = [str(runs[name][0]) for name in ("auto", "client_update")]
    assert script.main(["--json", "--runs", *dirs]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert all(r["ok"] for r in rows)
    assert len(rows) == 7 + 3 * 2
    assert all(r["fedunlearn"] is not None for r in rows)  # each compared with what we state
    assert {r["figure"] for r in rows if r["documented"] is not None} == set(script.DOCUMENTED)
    # a figure the docs print wrongly is caught
    monkeypatch.setitem(script.DOCUMENTED, "example T=30 a priori, replace-one", 15.22)
    assert script.main(["--json"]) == 1
    capsys.readouterr()
