"""What a DP run's guarantee covers: artefacts, released statistics, the a-priori bound."""

from __future__ import annotations

import json

import dp_accounting
import pytest
from dp_accounting import pld

from fedunlearn.config import PrivacyConfig, parse_config
from fedunlearn.privacy.accountant import calibrate_sampled_gaussian
from fedunlearn.privacy.guarantees import (
    RELEASED_STATISTICS,
    artefact_guarantees,
    unlearned_model_guarantee,
    upfront_totals,
)
from fedunlearn.privacy.ledger import DP_SGD_SCALAR_KEYS, SCALAR_KEYS
from fedunlearn.privacy.mechanisms import noise_multiplier
from fedunlearn.runs import run_info, train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

RUN = {
    "seed": 5,
    "data": {"dataset": "digits", "num_clients": 5},
    "model": {"name": "mlp", "hidden": [16]},
    "training": {"rounds": 4, "local_epochs": 1, "lr": 0.3, "batch_size": 32, "executor": "serial"},
    "history": {"policy": "fedadp"},
    "privacy": {"enabled": True, "clip_norm": 0.5, "epsilon_max": 3.0},
}


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("guarantees") / "run"
    train_run(parse_config(RUN), run_dir)
    return run_dir


def _pld(events, delta=1e-5, relation=dp_accounting.NeighboringRelation.REPLACE_ONE):
    acc = pld.PLDAccountant(value_discretization_interval=1e-3, neighboring_relation=relation)
    acc.compose(dp_accounting.ComposedDpEvent(events))
    return acc.get_epsilon(delta)


@pytest.mark.slow
def test_the_upfront_guarantee_composes_every_round_at_epsilon_max(dp_run):
    ledger = run_info(dp_run)["privacy"]
    g = ledger["epsilon_guarantee"]
    z = noise_multiplier(3.0, 1e-5)  # Eq. 6 at ε_max
    direct = _pld([dp_accounting.GaussianDpEvent(z)] * 4)  # replace-one: sensitivity 2S
    assert g["per_round_epsilon"] == 3.0
    assert g["rounds"] == 4
    assert g["pld_epsilon"] == pytest.approx(direct, rel=1e-3)
    # the realised schedule starts at ε_0 = 1: its total is smaller, and labelled data-dependent
    assert ledger["total_epsilon"] < g["pld_epsilon"]
    assert "not a DP guarantee" in ledger["schedule"]
    assert "adaptive choice of ε_t is not covered" in ledger["unaccounted"]
    saved = json.loads((dp_run / "privacy.json").read_text())
    assert saved["epsilon_guarantee"] == json.loads(json.dumps(g))


@pytest.mark.slow
def test_the_dp_sgd_upfront_guarantee_calibrates_sigma_at_epsilon_max():
    config = PrivacyConfig.model_validate(
        {"enabled": True, "mechanism": "dp_sgd", "clip_norm": 1.0, "epsilon_max": 2.0}
    )
    rows = [{"sample_rate": 0.25, "steps": 8, "epsilon": 1.0, "noise_multiplier": 3.0}] * 3
    g = upfront_totals(config, rows)
    sigma = calibrate_sampled_gaussian(0.25, 8, 2.0, 1e-5)
    step = dp_accounting.PoissonSampledDpEvent(0.25, dp_accounting.GaussianDpEvent(sigma))
    direct = _pld([dp_accounting.SelfComposedDpEvent(step, 8)] * 3)
    assert g["neighbour_relation"] == "replace_one"
    assert g["pld_epsilon"] == pytest.approx(direct, rel=1e-3)
    add_remove = _pld(
        [dp_accounting.SelfComposedDpEvent(step, 8)] * 3,
        relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
    )
    assert g["add_remove_pld_epsilon"] == pytest.approx(add_remove, rel=1e-3)
    assert g["pld_epsilon"] > 1.5 * add_remove > 2.0  # replace-one costs more
    assert g["rdp_epsilon"] is None  # dp-accounting has no RDP for sampled replace-one
    assert upfront_totals(config, []) is None


def test_every_released_statistic_has_a_status(dp_run):
    metrics = run_info(dp_run)["metrics"]
    names = {k.removeprefix("dp_") for m in metrics for k in m if k != "round"}
    names |= set(SCALAR_KEYS) | set(DP_SGD_SCALAR_KEYS) | {"client_sizes", "client_records"}
    assert names <= set(RELEASED_STATISTICS), names - set(RELEASED_STATISTICS)
    assert "train_loss" not in names  # DP clients upload no (noise-free) loss: issue 40
    for name in ("clipped_fraction", "raw_norm_median", "noise_to_signal"):
        assert RELEASED_STATISTICS[name].startswith("not private")
    assert RELEASED_STATISTICS["client_sizes"].startswith("public")
    ledger = run_info(dp_run)["privacy"]
    assert ledger["released_statistics"] == RELEASED_STATISTICS


def test_each_artefact_states_its_guarantee():
    train = artefact_guarantees(PrivacyConfig.model_validate({"enabled": True}))
    assert [train[k]["dp"] for k in ("uploads", "stored_history", "original_model")] == [True] * 3
    assert train["unlearned_model"]["dp"] is False
    store_only = artefact_guarantees(
        PrivacyConfig.model_validate({"enabled": True, "dp_scope": "store_only"})
    )
    assert store_only["uploads"]["dp"] is False
    # its stored models and aggregates are training's, from the clean uploads (issue 40)
    assert store_only["stored_history"]["dp"] is False
    assert store_only["original_model"]["dp"] is False
    assert not any(v["dp"] for v in artefact_guarantees(PrivacyConfig()).values())
    enabled = PrivacyConfig.model_validate({"enabled": True})
    assert unlearned_model_guarantee(enabled, fresh_dp=False)[0] is False
    assert unlearned_model_guarantee(enabled, fresh_dp=True)[0] is True
    assert unlearned_model_guarantee(PrivacyConfig(), fresh_dp=True)[0] is False


def test_fedadp_results_say_whether_the_released_model_is_dp(dp_run):
    request = UnlearnRequest.of([0])
    with UnlearnSession(dp_run) as session:
        plain = session.run(make_method("fedadp"), request)
        noised = session.run(make_method("fedadp", {"unlearn_dp": True}), request)
    p, n = plain.details.to_dict(), noised.details.to_dict()
    assert p["released_model_dp"] is False
    assert "no DP guarantee" in p["released_model_reason"]
    assert p["privacy"]["artefacts"]["unlearned_model"]["dp"] is False
    assert n["released_model_dp"] is True
    assert n["final_rounds"] == 0
    extra = n["privacy"]["unlearning_privacy"]
    assert extra["replayed_rounds"] == len(n["participants"])
    # the replayed releases add to the run's: the model's total exceeds the training total
    assert extra["total_epsilon_with_training"] > n["privacy"]["total_epsilon"]
