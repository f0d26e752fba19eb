"""FedADP unlearning: the projection identity, replay semantics, variants and guards."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError, UnsupportedHistoryError
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method
from fedunlearn.unlearn.fedadp.unlearner import calibrate, project

DP_RUN = {
    "seed": 6,
    "data": {"dataset": "digits", "num_clients": 6},
    "model": {"name": "mlp", "hidden": [16]},
    "training": {"rounds": 6, "local_epochs": 1, "lr": 0.3, "batch_size": 32, "executor": "serial"},
    "attack": {"kind": "backdoor", "num_malicious": 1, "trigger_size": 3},
    "history": {"policy": "fedadp"},
    "privacy": {"enabled": True, "clip_norm": "auto", "epsilon_max": 3.0},
}


def eq11(stored, fresh):
    """Eq. 11 as printed: cos(theta) ||g_bar|| / ||g_hat|| g_hat."""
    s, f = stored.double(), fresh.double()
    cos = float(s @ f) / (float(s.norm()) * float(f.norm()))
    return cos * float(s.norm()) / float(f.norm()) * f


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 64), st.integers(0, 2**31 - 1), st.floats(1e-3, 1e3))
def test_projection_equals_eq11(d, seed, scale):
    g = torch.Generator().manual_seed(seed)
    stored, fresh = torch.randn(d, generator=g) * scale, torch.randn(d, generator=g)
    u, cos = project(stored, fresh)
    assert torch.allclose(u.double(), eq11(stored, fresh), rtol=1e-5, atol=1e-6 * scale)
    assert float(u.norm()) <= float(stored.norm()) * (1 + 1e-5)  # the step is at most ||g_bar||
    assert -1 - 1e-9 <= cos <= 1 + 1e-9


def test_projection_edge_cases():
    fresh = torch.tensor([3.0, -1.0, 2.0])
    assert torch.allclose(project(fresh, fresh)[0], fresh)  # g_bar = g_hat -> U = g_hat
    assert torch.allclose(project(-fresh, fresh)[0], -fresh)  # g_bar = -g_hat -> U = -g_hat
    orth = torch.tensor([1.0, 3.0, 0.0])
    assert torch.allclose(project(orth, fresh)[0], torch.zeros(3), atol=1e-7)  # orthogonal -> 0
    assert torch.equal(project(fresh, torch.zeros(3))[0], torch.zeros(3))  # ||g_hat|| = 0
    assert torch.equal(project(torch.zeros(3), fresh)[0], torch.zeros(3))  # ||g_bar|| = 0
    u, cos = project(-fresh, fresh, clamp_negative_cos=True)
    assert torch.equal(u, torch.zeros(3))
    assert cos == pytest.approx(-1.0)
    assert torch.equal(calibrate(orth, fresh, "fresh", False)[0], fresh)
    norm = calibrate(2 * orth, fresh, "norm", False)[0]
    assert float(norm.norm()) == pytest.approx(2 * float(orth.norm()), rel=1e-6)


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("fedadp_unlearn") / "run"
    train_run(parse_config(DP_RUN), run_dir)
    return run_dir


@pytest.mark.slow
def test_fedadp_on_a_dp_run_replays_the_stored_rounds_without_the_forgotten(dp_run):
    with UnlearnSession(dp_run) as session:
        forget = sorted(session.run_view.malicious)
        result = session.run(make_method("fedadp"), UnlearnRequest.of(forget, "recover"))
        again = session.run(make_method("fedadp"), UnlearnRequest.of(forget, "recover"))
    details = result.details
    assert torch.equal(result.params, again.params)
    assert details.variant == "FedADP"
    assert details.trained_with_dp
    assert details.privacy["total_epsilon"] > 0
    assert len(details.privacy["epsilon_per_round"]) == 6
    for round_, ids in details.participants.items():
        assert not set(ids) & set(forget)
        assert set(ids) <= set(details.stored_clients[round_])
    assert result.costs.rounds == len(details.participants)
    assert result.costs.client_participations == sum(map(len, details.participants.values()))
    assert 0 < details.stored_update_fraction <= 1


@pytest.mark.slow
def test_unlearn_dp_and_options_change_the_result_deterministically(dp_run):
    request = UnlearnRequest.of([0])
    with UnlearnSession(dp_run) as session:
        plain = session.run(make_method("fedadp"), request)
        noisy = session.run(make_method("fedadp", {"unlearn_dp": True}), request)
        noisy2 = session.run(make_method("fedadp", {"unlearn_dp": True}), request)
        one_epoch = session.run(make_method("fedadp", {"local_epochs": 2}), request)
        first = session.run(make_method("fedadp", {"init": "first_selected"}), request)
    assert torch.equal(noisy.params, noisy2.params)
    assert not torch.equal(noisy.params, plain.params)
    assert one_epoch.costs.client_epochs == 2 * plain.costs.client_epochs
    assert not torch.equal(first.params, plain.params)


def test_overrides_on_a_live_selection_fail_before_any_work(dp_run):
    with UnlearnSession(dp_run) as session:
        context = session.context(UnlearnRequest.of([0]))
        with pytest.raises(UnsupportedHistoryError, match="needs a different selection"):
            make_method("fedadp", {"round_ratio": 0.9}).unlearn(UnlearnRequest.of([0]), context)
        assert context.meter.costs.client_epochs == 0
        assert context.meter.costs.history_bytes_read == 0


@pytest.mark.slow
def test_fedadp_on_a_dp_sgd_run_reports_the_per_example_ledger_and_dp_sgd_unlearn_dp(tmp_path):
    cfg = {
        **DP_RUN,
        "training": {**DP_RUN["training"], "rounds": 3},
        "privacy": {"enabled": True, "mechanism": "dp_sgd", "clip_norm": 1.0},
    }
    train_run(parse_config(cfg), tmp_path / "run")
    request = UnlearnRequest.of([0])
    with UnlearnSession(tmp_path / "run") as session:
        result = session.run(make_method("fedadp"), request)
        assert result.details.variant == "FedADP"
        assert result.details.privacy["mechanism"] == "dp_sgd"
        assert result.details.privacy["guarantee"].startswith("per example")
        private = session.run(make_method("fedadp", {"unlearn_dp": True}), request)
        again = session.run(make_method("fedadp", {"unlearn_dp": True}), request)
        cheaper = session.run(
            make_method("fedadp", {"unlearn_dp": True, "unlearn_epsilon": 0.5}), request
        )
        # without the session's private clients, DP-SGD fresh updates cannot be trained
        context = replace(session.context(request), private_clients=None)
        with pytest.raises(UnsupportedHistoryError, match="no private_clients"):
            make_method("fedadp", {"unlearn_dp": True}).unlearn(request, context)
        assert context.meter.costs.client_epochs == 0
        with pytest.raises(UnsupportedHistoryError, match="Drop unlearn_epsilon"):
            make_method("fedadp", {"unlearn_epsilon": 1.0}).unlearn(
                request, session.context(request)
            )
    assert torch.equal(private.params, again.params)
    assert not torch.equal(private.params, cheaper.params)
    d = private.details
    assert d.released_model_dp is True
    assert d.final_rounds == 0
    ledger = d.privacy["unlearning_privacy"]
    assert ledger["epsilon_per_round"] == [3.0] * len(d.participants)  # the run's ε_max
    assert ledger["total_epsilon_with_training"] > d.privacy["total_epsilon"]
    assert ledger["guarantee_with_training"] >= ledger["total_epsilon_with_training"]
    small = cheaper.details.privacy["unlearning_privacy"]
    assert small["fresh_total_epsilon"] < ledger["fresh_total_epsilon"]
    assert result.details.released_model_dp is False


def test_a_run_without_dp_gives_fedadp_without_dp(run_all):
    with UnlearnSession(run_all) as session:
        result = session.run(make_method("fedadp"), UnlearnRequest.of([0]))
        assert result.details.variant == "FedADP-without-DP"
        assert result.details.privacy["enabled"] is False
        context = session.context(UnlearnRequest.of([0]))
        with pytest.raises(UnsupportedHistoryError, match="unlearn_dp=true needs a run trained"):
            make_method("fedadp", {"unlearn_dp": True}).unlearn(UnlearnRequest.of([0]), context)
        assert context.meter.costs.client_epochs == 0


def test_full_selection_with_fresh_updates_is_exactly_retrain(run_all):
    # lambda = gamma = 1 keeps every round and client; uncalibrated fresh updates from M_0 with
    # the run's seeds are then FedAvg retraining without the forgotten client, bit for bit
    request = UnlearnRequest.of([1])
    params = {"round_ratio": 1.0, "client_ratio": 1.0, "calibration": "fresh"}
    with UnlearnSession(run_all) as session:
        fedadp = session.run(make_method("fedadp", params), request)
        retrain = session.run(make_method("retrain"), request)
    assert torch.equal(fedadp.params, retrain.params)
    assert fedadp.costs.client_epochs == retrain.costs.client_epochs


def test_invalid_parameters_name_the_field():
    with pytest.raises(ConfigError, match="invalid parameters for method 'fedadp': local_epochs"):
        make_method("fedadp", {"local_epochs": 0})
    with pytest.raises(ConfigError, match="calibration"):
        make_method("fedadp", {"calibration": "eq12"})
