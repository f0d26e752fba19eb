"""Crab on small runs: rollback math, calibration, replay equivalence, live = derived, bounds.

Crab's paper-faithful pieces are tested with the options that select them (``rollback: paper``,
``final_rounds: 0``); the defaults are tested in test_crab_rollback.py and test_crab_quickstart.py.
"""

from __future__ import annotations

import pytest
import torch

from fedunlearn.config import parse_config
from fedunlearn.errors import UnsupportedHistoryError
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method
from fedunlearn.unlearn.crab.rollback import influence, rollback_index, weighted_mean
from fedunlearn.unlearn.replay import calibrate, calibrated_replay

BASE = {  # the config of conftest's shared runs (run_all, run_none)
    "seed": 2,
    "data": {"dataset": "digits", "num_clients": 5},
    "model": {"name": "mlp", "hidden": [16]},
    "training": {"rounds": 5, "local_epochs": 2, "lr": 0.3, "batch_size": 32, "executor": "serial"},
    "attack": {"kind": "backdoor", "num_malicious": 1, "trigger_size": 3},
}


@pytest.fixture(scope="module")
def run_crab(tmp_path_factory):
    """The shared backdoored digits run, recorded live with policy crab."""
    run_dir = tmp_path_factory.mktemp("crab") / "run"
    train_run(parse_config({**BASE, "history": {"policy": "crab"}}), run_dir)
    return run_dir


def recover(run_dir, params=None, derived_cache=True):
    with UnlearnSession(run_dir, evaluate=False, derived_cache=derived_cache) as session:
        request = UnlearnRequest.of(sorted(session.run_view.malicious), "recover")
        return session.run(make_method("crab", params), request)


# ----- V0: sensitivity, rollback index, calibration --------------------------------------------


def test_sensitivity_is_zero_when_no_malicious_client_was_stored():
    g = torch.Generator().manual_seed(0)
    deltas = {c: torch.randn(30, generator=g) for c in range(4)}
    sizes = {0: 10, 1: 20, 2: 30, 3: 40}
    previous = torch.randn(30, generator=g, dtype=torch.float64)
    stored = {0, 1, 2}
    for forget in ({3}, set()):  # malicious client not stored / nobody malicious
        benign = stored - forget
        diff = influence(deltas, sizes, stored, previous) - influence(
            deltas, sizes, benign, previous
        )
        assert float(diff.norm()) == 0.0
    # with a stored malicious client, I(K) - I(K^-) = mean(K) - mean(K^-): Gbar cancels
    diff = influence(deltas, sizes, stored, previous) - influence(deltas, sizes, {0, 1}, previous)
    expected = weighted_mean({c: deltas[c] for c in stored}, sizes) - weighted_mean(
        {c: deltas[c] for c in (0, 1)}, sizes
    )
    assert torch.allclose(diff, expected, atol=1e-12)
    assert float(influence(deltas, sizes, set(), previous).norm()) == 0.0  # I(empty) = 0


def test_rollback_index_literal_and_prefix_rules():
    sens = [0.0, 5.0, 0.0, 0.0, 0.0]
    infl = [1.0, 1.0, 1.0, 1.0, 10.0]
    j, cum_s, phi = rollback_index(sens, infl, beta=0.5, rule="literal")
    assert cum_s == [0.0, 5.0, 5.0, 5.0, 5.0]
    assert phi == [0.5, 1.0, 1.5, 2.0, 7.0]
    assert j == 5  # literal (Eq. 6): the most recent j with S(j) <= Φ(j)
    assert rollback_index(sens, infl, beta=0.5)[0] == 1  # prefix, the default
    assert rollback_index([1.0, 1.0], [1.0, 1.0], beta=0.3)[0] == 0  # none: roll back to M_0


def test_calibration_keeps_the_stored_norm_and_the_fresh_direction():
    g = torch.Generator().manual_seed(1)
    stored, fresh = torch.randn(100, generator=g), torch.randn(100, generator=g) * 7
    out = calibrate(stored, fresh)
    assert torch.isclose(out.norm(), stored.norm(), rtol=1e-6)
    assert torch.isclose(
        torch.nn.functional.cosine_similarity(out, fresh, dim=0), torch.tensor(1.0)
    )
    layered = calibrate(stored, fresh, "layer", (60, 40))
    assert torch.isclose(layered[:60].norm(), stored[:60].norm(), rtol=1e-6)


# ----- equivalence and the two selection paths ------------------------------------------------


@pytest.mark.slow
def test_no_selection_no_rollback_equals_calibrated_replay_of_all_rounds_bit_for_bit(run_all):
    params = {"round_ratio": 1.0, "client_ratio": 1.0, "no_rollback": True, "final_rounds": 0}
    crab = recover(run_all, params)
    assert crab.details.rollback_round == 0
    assert crab.details.recovery_rounds == (1, 2, 3, 4, 5)
    with UnlearnSession(run_all, evaluate=False) as session:
        request = UnlearnRequest.of(sorted(session.run_view.malicious), "recover")
        context = session.context(request)
        replayed, _ = calibrated_replay(
            context,
            range(1, context.num_rounds + 1),
            start_params=session.run_view.initial_params,
            spec=context.clients.spec,
        )
    assert torch.equal(crab.params, replayed)
    assert crab.costs.client_epochs == context.meter.costs.client_epochs


def test_live_selection_equals_the_one_derived_from_a_full_history(run_all, run_crab, base_config):
    assert {**base_config, "history": {"policy": "all"}} == {**BASE, "history": {"policy": "all"}}
    live, derived = recover(run_crab), recover(run_all)
    for key in ("stored_rounds", "stored_clients", "rollback_index", "recovery_rounds"):
        assert getattr(live.details, key) == getattr(derived.details, key)
    assert torch.equal(live.params, derived.params)
    assert live.details.selection_source == "crab"
    assert derived.details.windows
    with UnlearnSession(run_crab) as a, UnlearnSession(run_all) as b:
        request = UnlearnRequest.of(sorted(a.run_view.malicious), "recover")
        needed = make_method("crab").history_bytes_needed(a.context(request))
        assert needed == make_method("crab").history_bytes_needed(b.context(request))
        d = a.run_view.initial_params.numel()
        stored = live.details.stored_clients
        assert needed == (1 + len(stored) + sum(map(len, stored.values()))) * d * 4


def test_selection_overrides_are_refused_on_a_live_crab_run(run_crab):
    with pytest.raises(UnsupportedHistoryError, match="different selection"):
        recover(run_crab, {"round_ratio": 1.0})


def test_rollback_is_capped_so_at_least_one_round_is_replayed(run_all):
    result = recover(run_all, {"rollback": "paper", "beta": 1e6, "final_rounds": 0})
    d = result.details
    assert d.rollback_index == d.num_stored_rounds - 1
    assert d.rollback_capped
    assert result.costs.rounds == 1
    assert len(d.recovery_rounds) == 1
    for t, ids in d.participants.items():
        assert not set(ids) & set(d.stored_malicious.get(t, []))


# ----- bounds -------------------------------------------------------------------------------


@pytest.mark.slow
def test_triangle_bound_holds_and_theorem_bounds_are_reported(run_all):
    # derived_cache=False: the second run would read the selection the first derived (or an
    # earlier test's), and save those reads; the comparison of the bytes read is of the method's
    params = {"no_rollback": True, "bound_check": True, "final_rounds": 0}
    result = recover(run_all, params, derived_cache=False)
    bounds = result.details.bounds
    assert bounds["triangle_holds"]
    assert len(bounds["rows"]) == result.costs.rounds
    for row in bounds["rows"]:
        assert 0 <= row["observed"] <= row["triangle"] * (1 + 1e-5) + 1e-6
        assert row["paper"] > 0
        assert row["safe"] >= row["paper"] - 1e-9  # sqrt(a)+sqrt(b) >= ...
    assert bounds["L"] > 0
    assert bounds["G"] > 0
    assert bounds["delta_F"] > 0
    assert bounds["reference_retrain_cost"]["client_epochs"] > 0
    report = result.details.certified_bound()  # what the receipt's bound check reads
    assert report is not None
    assert report.name == "Crab Theorem 1 (B_safe)"
    assert report.bound == bounds["rows"][-1]["safe"]
    assert report.observed == bounds["rows"][-1]["observed"]
    plain = recover(run_all, {"no_rollback": True, "final_rounds": 0}, derived_cache=False)
    assert plain.details.certified_bound() is None  # no bound_check, no certificate
    assert plain.costs.client_epochs == result.costs.client_epochs  # diagnostic not billed
    # nor timed as the method's: its reference retrain is diagnostic_seconds
    assert result.costs.diagnostic_seconds > 0
    assert plain.costs.diagnostic_seconds == 0
    assert result.costs.history_bytes_read == plain.costs.history_bytes_read
    assert torch.equal(plain.params, result.params)


def test_stored_malicious_clients_give_sensitivity_and_never_take_part(run_all):
    d = recover(run_all, {"client_ratio": 1.0, "rollback": "paper"}).details
    malicious_rounds = {int(t) for t in d.stored_malicious}
    assert malicious_rounds == set(d.stored_rounds)  # δ = 1 keeps everybody
    assert all(s > 0 for s in d.sensitivity)
    assert list(d.cumulative_sensitivity) == sorted(d.cumulative_sensitivity)
    for ids in d.participants.values():
        assert not set(ids) & {int(c) for v in d.stored_malicious.values() for c in v}
