"""FedADP's defaults: calibration auto, final tuning within the epoch budget, the paper preset."""

from __future__ import annotations

import pytest
import torch

from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method
from fedunlearn.unlearn.fedadp.params import FedADPParams
from fedunlearn.unlearn.tuning import final_round_count

RUN = {
    "seed": 6,
    "data": {"dataset": "digits", "num_clients": 6},
    "model": {"name": "mlp", "hidden": [16]},
    "training": {"rounds": 6, "local_epochs": 1, "lr": 0.3, "batch_size": 32, "executor": "serial"},
    "attack": {"kind": "backdoor", "num_malicious": 1, "trigger_size": 3},
    "history": {"policy": "fedadp"},
}
CLIENT_UPDATE = {"enabled": True, "clip_norm": 0.5, "epsilon_max": 3.0}
DP_SGD = {"enabled": True, "mechanism": "dp_sgd", "clip_norm": 1.0}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fedadp_defaults")
    out = {}
    for name, over in {
        "clean": {},
        "dp": {"privacy": CLIENT_UPDATE},
    }.items():
        out[name] = root / name
        train_run(parse_config({**RUN, **over}), out[name])
    return out


def test_auto_calibration_is_fresh_exactly_when_the_stored_history_is_dp_noised():
    default, paper = FedADPParams(), FedADPParams(preset="paper")
    assert default.resolved_calibration(dp_history=True) == "fresh"
    assert default.resolved_calibration(dp_history=False) == "projection"
    assert paper.resolved_calibration(dp_history=True) == "projection"
    assert FedADPParams(calibration="norm").resolved_calibration(dp_history=True) == "norm"
    assert default.resolved_final_rounds(dp_history=True) == "auto"
    assert default.resolved_final_rounds(dp_history=False) == 0
    assert paper.resolved_final_rounds(dp_history=True) == 0
    assert FedADPParams(unlearn_dp=True).resolved_final_rounds(dp_history=True) == 0


def test_the_paper_preset_refuses_what_alg2_does_not_do():
    with pytest.raises(ConfigError, match="preset 'paper' is Eq. 11 without final tuning"):
        make_method("fedadp", {"preset": "paper", "calibration": "fresh"})
    with pytest.raises(ConfigError, match="preset 'paper'"):
        make_method("fedadp", {"preset": "paper", "final_rounds": 2})
    with pytest.raises(ConfigError, match="unlearn_dp=true runs no final tuning"):
        make_method("fedadp", {"unlearn_dp": True, "final_rounds": 1})


@pytest.mark.slow
def test_without_dp_the_default_is_the_eq11_replay_bit_for_bit(runs):
    request = UnlearnRequest.of([0])
    with UnlearnSession(runs["clean"]) as session:
        default = session.run(make_method("fedadp"), request)
        paper = session.run(make_method("fedadp", {"preset": "paper"}), request)
        explicit = session.run(
            make_method("fedadp", {"calibration": "projection", "final_rounds": 0}), request
        )
    assert torch.equal(default.params, paper.params)
    assert torch.equal(default.params, explicit.params)
    d = default.details
    assert d.calibration == "projection"
    assert d.final_rounds == 0
    assert 0 < d.step_ratio < 1.5  # Eq. 11 rescales: the ratio is measured, not 1 by definition
    assert d.released_model_dp is False
    assert "without DP" in d.released_model_reason


@pytest.mark.slow
def test_on_a_dp_run_auto_replays_fresh_updates_and_tunes_within_the_budget(runs):
    request = UnlearnRequest.of([0])
    with UnlearnSession(runs["dp"]) as session:
        default = session.run(make_method("fedadp"), request)
        paper = session.run(make_method("fedadp", {"preset": "paper"}), request)
        retrain = session.run(make_method("retrain"), request)
        full = session.run(make_method("fedadp", {"epoch_budget": 1.0}), request)
    d, p = default.details, paper.details
    assert d.calibration == "fresh"
    assert d.step_ratio == pytest.approx(1.0)
    assert p.calibration == "projection"
    assert p.final_rounds == 0
    assert p.step_ratio > 0
    assert p.step_ratio != pytest.approx(1.0)
    # the replay alone (16 client epochs) exceeds 0.5 x Retrain's 30: no tuning round fits
    assert default.costs.client_epochs == sum(map(len, d.participants.values())) == 16
    assert d.final_rounds == 0
    f = full.details
    skipped = 6 - len(f.participants)
    assert 0 < f.final_rounds == skipped  # the whole gap fits the budget of 1.0
    assert full.costs.client_epochs <= retrain.costs.client_epochs
    assert full.costs.rounds == len(f.participants) + f.final_rounds
    assert len(full.round_metrics) == full.costs.rounds
    assert not torch.equal(default.params, paper.params)


def test_the_tuning_budget_caps_the_rounds(runs):
    with UnlearnSession(runs["dp"]) as session:
        context = session.context(UnlearnRequest.of([0]))
        retrain_runs = sum(len(context.original_participants(t)) for t in range(1, 7))  # 30
        per_round = 5  # the remaining clients of one tuning round
        # 2 replayed rounds of 5 clients = 10 client runs; 0.5 x 30 = 15: room for 1 round
        assert final_round_count(context, "auto", 0.5, start_round=0, replay_sizes=[5, 5]) == 1
        # the gap caps too: 6 rounds, 4 replayed, 2 left, whatever the budget
        assert final_round_count(context, "auto", 1.0, start_round=0, replay_sizes=[1] * 4) == 2
        # over budget already: no tuning
        assert final_round_count(context, "auto", 0.3, start_round=0, replay_sizes=[5, 5]) == 0
        # fresh updates of 2 epochs count twice against an E = 1 Retrain
        assert (
            final_round_count(
                context, "auto", 0.5, start_round=0, replay_sizes=[5], replay_epochs=2
            )
            == (15 - 10) // per_round
        )
        assert final_round_count(context, 3, 0.1, start_round=0, replay_sizes=[5]) == 3
        assert retrain_runs == 30


@pytest.mark.slow
def test_dp_sgd_default_replaying_every_round_and_client_is_clipped_retrain(tmp_path):
    # λ = γ = 1 on an 'all' run: the default (fresh updates on a DP history, no tuning since no
    # round is skipped) is Retrain with the same clipped, noise-free local training, bit for bit
    cfg = {
        **RUN,
        "training": {**RUN["training"], "rounds": 3},
        "history": {"policy": "all"},
        "privacy": DP_SGD,
    }
    train_run(parse_config(cfg), tmp_path / "run")
    request = UnlearnRequest.of([1])
    with UnlearnSession(tmp_path / "run") as session:
        fedadp = session.run(
            make_method("fedadp", {"round_ratio": 1.0, "client_ratio": 1.0}), request
        )
        retrain = session.run(make_method("retrain"), request)
        paper = session.run(
            make_method("fedadp", {"round_ratio": 1.0, "client_ratio": 1.0, "preset": "paper"}),
            request,
        )
    assert fedadp.details.calibration == "fresh"
    assert fedadp.details.final_rounds == 0
    assert torch.equal(fedadp.params, retrain.params)
    assert fedadp.costs.client_epochs == retrain.costs.client_epochs
    assert not torch.equal(paper.params, retrain.params)  # Eq. 11 on noisy history differs
