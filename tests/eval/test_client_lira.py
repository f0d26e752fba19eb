"""The client-level membership test: controls on the quickstart, calibration, cost, bad input."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from fedunlearn.config import load_config, parse_config
from fedunlearn.errors import ConfigError, UnknownClientError
from fedunlearn.eval.mia import (
    ClientMembershipEvidence,
    fit_client_membership,
    measure_client_membership,
)
from fedunlearn.eval.mia.client_lira import _fit, _score, leave_one_out_scores, share_toward
from fedunlearn.fl.client import local_update
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

REPO_ROOT = Path(__file__).resolve().parents[2]

TINY = {
    "seed": 3,
    "data": {"dataset": "digits", "num_clients": 5},
    "model": {"name": "mlp", "hidden": [8]},
    "training": {"rounds": 2, "local_epochs": 1, "lr": 0.1, "batch_size": 64},
    "history": {"policy": "none"},
}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("lira_tiny") / "run"
    train_run(parse_config(TINY), out)
    return out


evidence_models: dict[str, torch.Tensor] = {}


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    """The digits quickstart (client 0 honest) and the test's evidence, forgetting client 0."""
    out = tmp_path_factory.mktemp("lira_quickstart") / "run"
    # Retrain reads the client records only: no update needs to be stored
    config = load_config(
        REPO_ROOT / "configs" / "digits_quickstart.yaml", {"history": {"policy": "none"}}
    )
    train_run(config, out)
    with UnlearnSession(out, evaluate=False) as session:
        retrain = session.run(make_method("retrain"), UnlearnRequest.of([0]))
        federation = session.federation
        original = session.run_view.final_params
        tuned = local_update(
            federation.model,
            retrain.params,
            federation.client_data[0],
            replace(federation.spec, epochs=20),
            seed=1,
        )
        noise = torch.randn(original.shape, generator=torch.Generator().manual_seed(0))
        models = {
            "original": original,
            "retrain": retrain.params,
            "noisy": original + 1e-6 * noise,
            "fine_tuned": retrain.params + tuned.delta,
        }
        evidence = measure_client_membership(session, [0], models, seed=0)
        size = session.run_view.client_sizes[0]
    evidence_models.update(models)
    return evidence, retrain, size


@pytest.mark.slow
def test_quickstart_original_and_its_noisy_copy_flagged_retrain_not(quickstart):
    evidence, _, _ = quickstart
    assert evidence.flagged("original")
    assert evidence.flagged("noisy")
    assert not evidence.flagged("retrain")
    assert evidence.power is not None
    assert evidence.power >= 0.75


@pytest.mark.slow
def test_quickstart_fitness_range_holds_the_original_and_retrain(quickstart):
    evidence, _, _ = quickstart
    low, high = evidence.domain
    assert low < high
    # the models trained as the run was lie within the references' range
    assert evidence.region("original") == "within"
    assert evidence.region("retrain") == "within"
    assert evidence.region("noisy") == "within"
    assert set(evidence.notes["reference_fitness"]) == {"in", "out"}
    # the "without" references are exact retrains: near Retrain along o - r, the original at 1
    toward = evidence.reference_toward
    assert len(toward) == 4
    assert all(-0.3 < t < 0.3 for t in toward), toward
    assert share_toward(
        0.25 * evidence_models["original"] + 0.75 * evidence_models["retrain"],
        evidence_models["retrain"],
        evidence_models["original"],
    ) == pytest.approx(0.25, abs=1e-6)


@pytest.mark.slow
def test_quickstart_model_fine_tuned_on_the_client_is_flagged(quickstart):
    evidence, _, _ = quickstart
    assert evidence.flagged("fine_tuned")
    assert evidence.scores["fine_tuned"] > evidence.scores["original"]


@pytest.mark.slow
def test_quickstart_cost_is_reported_in_client_epochs_and_seconds(quickstart):
    evidence, retrain, size = quickstart
    # 4 "out" references cost a Retrain each (9 clients), 4 "in" ones the original (10 clients)
    assert evidence.num_reference_models == 8
    assert evidence.cost_client_epochs == 4 * retrain.costs.client_epochs * (1 + 10 / 9)
    assert 0 < evidence.cost_seconds < 120
    assert evidence.notes["num_examples"] == {0: size}
    assert set(evidence.notes["client_scores"]["original"]) == {0}


def test_leave_one_out_excludes_a_reference_from_its_own_gaussians():
    rng = np.random.default_rng(0)
    phi_in = rng.normal(1.0, 0.5, size=(3, 20))
    phi_out = rng.normal(0.0, 0.5, size=(3, 20))
    phi_out[0] += 3.0  # an "out" reference that looks like a member
    loo_in, loo_out = leave_one_out_scores(phi_in, phi_out)
    # its score is that of the Gaussians fitted on the other five references
    expected = _score(phi_out[0], *_fit(phi_in, phi_out[1:]))
    assert loo_out[0] == pytest.approx(expected)
    # fitted on itself too, it would have pulled mu_out toward itself and scored lower
    assert _score(phi_out[0], *_fit(phi_in, phi_out)) < loo_out[0] - 0.5
    # and changing its own row changes nobody's Gaussians but the others'
    moved = phi_out.copy()
    moved[0] -= 10.0
    assert leave_one_out_scores(phi_in, moved)[1][0] == pytest.approx(
        _score(moved[0], *_fit(phi_in, phi_out[1:]))
    )
    assert loo_in[0] == pytest.approx(_score(phi_in[0], *_fit(phi_in[1:], phi_out)))


@pytest.mark.slow
def test_same_seed_same_scores_other_seed_other_references(tiny_run):
    with UnlearnSession(tiny_run, evaluate=False) as session:
        models = {"original": session.run_view.final_params}
        first = measure_client_membership(session, [1], models, num_reference=4, seed=5)
        again = measure_client_membership(session, [1], models, num_reference=4, seed=5)
        other = measure_client_membership(session, [1], models, num_reference=4, seed=6)
    assert isinstance(first, ClientMembershipEvidence)
    assert first.scores == again.scores
    assert first.threshold == again.threshold
    assert first.notes["reference_scores"] == again.notes["reference_scores"]
    assert first.scores != other.scores


def test_time_budget_stops_reference_training_and_is_inconclusive(tiny_run):
    with UnlearnSession(tiny_run, evaluate=False) as session:
        full = measure_client_membership(
            session, [1], {"original": session.run_view.final_params}, num_reference=4
        )
        cut = measure_client_membership(
            session,
            [1],
            {"original": session.run_view.final_params},
            num_reference=4,
            max_seconds=1e-9,
        )
    # the full run trained 2 "in" and 2 "out" references: 2 rounds x (5 or 4 clients) x 1 epoch
    assert full.cost_client_epochs == 2 * 2 * 5 + 2 * 2 * 4
    assert full.notes["planned_client_epochs"] == full.cost_client_epochs
    assert not full.notes["budget_exhausted"]
    # with no time, no round starts
    assert cut.notes["budget_exhausted"]
    assert cut.num_reference_models == 0
    assert cut.cost_client_epochs == 0
    assert cut.cost_seconds < full.cost_seconds
    assert cut.power is None
    assert cut.threshold == float("inf")
    assert not cut.flagged("original")
    assert "raise max_seconds" in cut.notes["inconclusive"]


@pytest.mark.parametrize(
    ("forget", "models", "options", "error", "message"),
    [
        ([42], None, {}, UnknownClientError, "client(s) 42 not in this run"),
        ([], None, {}, ConfigError, "forget is empty"),
        ([1], {}, {}, ConfigError, "must include 'original'"),
        ([1], {"original": torch.zeros(3)}, {}, ConfigError, "flat vector of this run's"),
        ([1], None, {"num_reference": 3}, ConfigError, "num_reference must be an int >= 4"),
        ([1], None, {"target_fpr": 0.0}, ConfigError, "target_fpr must lie in (0, 0.5)"),
        ([1], None, {"max_seconds": 0}, ConfigError, "max_seconds must be > 0"),
        ([1], None, {"skip": "yes"}, ConfigError, "skip must be a bool"),
    ],
)
def test_bad_input_raises_one_clear_line(tiny_run, forget, models, options, error, message):
    with UnlearnSession(tiny_run, evaluate=False) as session:
        given = {"original": session.run_view.final_params} if models is None else models
        with pytest.raises(error) as caught:
            measure_client_membership(session, forget, given, **options)
    text = str(caught.value)
    assert message in text
    assert "\n" not in text


def test_time_budget_is_respected_up_to_one_round(tiny_run):
    with UnlearnSession(tiny_run, evaluate=False) as session:
        models = {"original": session.run_view.final_params}
        four = measure_client_membership(session, [1], models, num_reference=4)
        budget = max(four.cost_seconds, 0.05)
        many = measure_client_membership(session, [1], models, num_reference=80, max_seconds=budget)
    assert many.notes["budget_exhausted"]
    assert many.num_reference_models < 80
    assert many.cost_seconds <= budget + 0.5  # one tiny round and the scoring past the budget


def test_skip_trains_nothing_and_says_what_the_test_would_cost(tiny_run):
    with UnlearnSession(tiny_run, evaluate=False) as session:
        run = session.run_view
        models = {"original": run.final_params, "candidate": run.initial_params}
        skipped = measure_client_membership(session, [1], models, num_reference=4, skip=True)
    assert skipped.power is None
    assert skipped.num_reference_models == 0
    assert skipped.cost_client_epochs == 0
    assert not skipped.flagged("original")
    assert not skipped.flagged("candidate")
    # 2 Retrains (2 rounds x 4 clients) and 2 originals (2 rounds x 5 clients), 1 epoch each
    assert skipped.notes["planned_client_epochs"] == 36
    assert skipped.notes["retrain_client_epochs"] == 8
    assert skipped.notes["inconclusive"].startswith("skipped on request: 4 reference models")
    assert "4.5x a Retrain" in skipped.notes["inconclusive"]


def test_a_test_fitted_once_scores_later_models_as_one_call_does(tiny_run):
    with UnlearnSession(tiny_run, evaluate=False) as session:
        run = session.run_view
        both = {"original": run.final_params, "candidate": run.initial_params}
        at_once = measure_client_membership(session, [1, 2], both, num_reference=4, seed=1)
        fitted = fit_client_membership(session, [1, 2], num_reference=4, seed=1)
        first = fitted.evidence({"original": run.final_params})
        later = fitted.evidence(both)
        with pytest.raises(ConfigError, match="must include 'original'"):
            fitted.evidence({"candidate": run.initial_params})
    assert later.scores == at_once.scores
    assert later.threshold == at_once.threshold == first.threshold
    assert later.power == at_once.power
    assert later.cost_client_epochs == at_once.cost_client_epochs
    assert first.scores["original"] == at_once.scores["original"]
    assert set(later.notes["client_scores"]["candidate"]) == {1, 2}


@pytest.mark.slow
def test_the_fitness_range_needs_three_references_per_side(tiny_run):
    # with 2 per side the two-sided 99% Student-t factor (63.7) makes a range that holds every
    # model: it is not measured, and the receipt judges every model as before
    with UnlearnSession(tiny_run, evaluate=False) as session:
        run = session.run_view
        models = {"original": run.final_params, "candidate": run.initial_params}
        two = measure_client_membership(session, [1], models, num_reference=4, seed=2)
        three = measure_client_membership(session, [1], models, num_reference=6, seed=2)
    assert two.domain is None
    assert "fewer than 3 references per side" in two.notes["fitness_range"]
    assert two.region("candidate") == "unknown"
    assert three.domain is not None
    assert three.domain[0] < three.domain[1]
    assert len(three.notes["reference_fitness"]["in"]) == 3
    # the untrained M_0 is far less fit than any reference trained as the run was
    assert three.region("candidate") == "below"
    assert three.region("original") == "within"
