"""Crab's Stage II rules (participation, bounded, paper), their warnings, and final tuning."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError, UnsupportedHistoryError
from fedunlearn.fl.engine import run_rounds
from fedunlearn.history import ClientRecord
from fedunlearn.history.policy import DOT_AGGREGATE_KEY
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method
from fedunlearn.unlearn.context import TrainingInfo
from fedunlearn.unlearn.crab.rollback import (
    forgotten_influence_bound,
    participation_index,
    weighted_mean,
)

LATE = {  # two backdoor attackers of 10 join at round 8; half the clients take part each round
    "seed": 1,
    "data": {"dataset": "digits", "num_clients": 10},
    "model": {"name": "mlp", "hidden": [64]},
    "training": {
        "rounds": 15,
        "local_epochs": 2,
        "lr": 0.1,
        "batch_size": 32,
        "participation": 0.5,
    },
    "attack": {"kind": "backdoor", "num_malicious": 2, "trigger_size": 3, "join_round": 8},
    "history": {"policy": "crab"},
}
PAPER = {"rollback": "paper", "rule": "literal", "final_rounds": 0}  # Eqs. 4-6 as printed


@pytest.fixture(scope="module")
def late_run(tmp_path_factory):
    """The late-join run, recorded live with policy crab."""
    run_dir = tmp_path_factory.mktemp("crab_late") / "run"
    train_run(parse_config(LATE), run_dir)
    return run_dir


def recover(run_dir, params=None):
    with UnlearnSession(run_dir) as session:
        request = UnlearnRequest.of(sorted(session.run_view.malicious), "recover")
        result = session.run(make_method("crab", params), request)
        return result, session.evaluation.evaluate(result.params)


# ----- participation [CB10] --------------------------------------------------------------------


def test_participation_index_is_the_last_stored_round_before_the_first_participation():
    stored = [2, 3, 5, 8, 9]
    assert participation_index(stored, first=6) == 3  # M_5 precedes round 6
    assert participation_index(stored, first=5) == 2  # M_5 already holds round 5's updates
    assert participation_index(stored, first=1) == 0  # M_0
    assert participation_index(stored, first=None) == 5  # never aggregated: every round


@pytest.mark.slow
def test_late_attackers_let_participation_roll_back_past_m0_to_a_model_free_of_them(late_run):
    # Execute: the default (participation) and a forced rollback to M_0, same run
    default, q = recover(late_run)
    from_m0, q0 = recover(late_run, {"no_rollback": True})
    d = default.details
    # Assert: j* > 0, before the attackers' first round, nothing to warn about
    assert d.rollback == "participation"
    assert d.first_forgotten_round >= LATE["attack"]["join_round"]
    assert d.rollback_index > 0
    assert 0 < d.rollback_round < d.first_forgotten_round
    assert d.rollback_free_of_forgotten
    assert d.warnings == ()
    # safe: the rollback model is exactly the benign clients' own trajectory up to t_j*
    with UnlearnSession(late_run) as session:
        request = UnlearnRequest.of(sorted(session.run_view.malicious), "recover")
        context = session.context(request)
        benign_only = run_rounds(
            context.clients,
            context.aggregator,
            context.initial_params,
            num_rounds=d.rollback_round,
            participation=context.training.participation,
        )
        assert torch.equal(benign_only, context.history.read_model(d.rollback_round))
        retrain = session.run(make_method("retrain"), request)
        retrain_q = session.evaluation.evaluate(retrain.params)
    # it saves work and removes the backdoor as well as rolling back to M_0 does
    assert default.costs.client_epochs < from_m0.costs.client_epochs
    assert default.costs.client_epochs <= 0.6 * retrain.costs.client_epochs
    assert q["backdoor_asr"] <= retrain_q["backdoor_asr"] + 0.03
    assert q0["backdoor_asr"] <= retrain_q["backdoor_asr"] + 0.03


# ----- paper: Eqs. 4-6 as printed, and its warnings --------------------------------------------


def test_paper_rollback_past_unstored_participation_is_flagged(late_run):
    result, _ = recover(late_run, PAPER)
    d = result.details
    # the late attackers are rarely stored, so Eq. 4's S stays small and j* lands after them
    assert d.rollback_round >= d.first_forgotten_round
    assert not d.rollback_free_of_forgotten
    codes = [w.split(":")[0] for w in d.warnings]
    assert codes == ["rollback_includes_forgotten", "rollback_after_unstored_participation"]
    assert f"t_j* = {d.rollback_round}" in d.warnings[1]
    assert result.details.to_dict()["warnings"] == list(d.warnings)  # JSON-ready


# ----- Φ's running Gbar [CB6, CB7]: the review's surviving mutant ------------------------------


@pytest.mark.parametrize("client_ratio", [None, 1.0])  # 1.0: the attacker is kept every round
def test_phi_subtracts_the_previous_stored_rounds_aggregate(run_all, client_ratio):
    result, _ = recover(run_all, {"rollback": "paper", "client_ratio": client_ratio})
    d = result.details
    with UnlearnSession(run_all) as session:
        forget = set(session.run_view.malicious)
        history = session.run_view.store
        sizes = {c: session.federation.num_samples(c) for c in session.federation.client_ids}
        size = session.run_view.initial_params.numel()
        previous = torch.zeros(size, dtype=torch.float64)  # Gbar_0
        expected = []
        for t in d.stored_rounds:
            kept = d.stored_clients[str(t)]
            deltas = {c: history.read_update(t, c) for c in kept}
            benign = {c: deltas[c] for c in kept if c not in forget}
            i_benign = weighted_mean(benign, sizes) - previous if benign else previous * 0
            expected.append(float(i_benign.norm()))
            previous = weighted_mean(deltas, sizes)  # Gbar_j: all kept clients of round t_j
    assert len(expected) >= 2
    assert expected[1] > 0
    if client_ratio == 1.0:
        assert all(str(t) in d.stored_malicious for t in d.stored_rounds)
    assert list(d.benign_influence) == pytest.approx(expected, rel=1e-9)
    assert list(d.threshold) == pytest.approx(
        [0.3 * sum(expected[: k + 1]) for k in range(len(expected))], rel=1e-9
    )


# ----- bounded [CB11] ---------------------------------------------------------------------------


def _records(deltas, sizes, aggregate, stored=()):
    return [
        ClientRecord(
            c,
            "accepted",
            sizes[c],
            norm=float(deltas[c].norm()),
            scalars={DOT_AGGREGATE_KEY: float(deltas[c].double() @ aggregate)},
            stored=c in stored,
        )
        for c in deltas
    ]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(3, 8), st.integers(1, 2))
def test_influence_bound_is_exact_for_one_forgotten_client_and_an_upper_bound_otherwise(
    seed, num_clients, num_forgotten
):
    g = torch.Generator().manual_seed(seed)
    deltas = {
        c: torch.randn(20, generator=g, dtype=torch.float64) * (1 + c) for c in range(num_clients)
    }
    sizes = {c: int(torch.randint(5, 50, (1,), generator=g)) for c in deltas}
    forget = frozenset(range(num_forgotten))
    aggregate = weighted_mean(deltas, sizes)  # G_t (FedAvg)
    benign = weighted_mean({c: d for c, d in deltas.items() if c not in forget}, sizes)  # G_t^-
    true = float((aggregate - benign).norm())
    bound = forgotten_influence_bound(_records(deltas, sizes, aggregate), forget)
    assert bound >= true * (1 - 1e-9) - 1e-12
    if num_forgotten == 1:
        assert bound == pytest.approx(true, rel=1e-6, abs=1e-9)
    gone = weighted_mean({c: deltas[c] for c in forget}, sizes)
    exact = forgotten_influence_bound(
        _records(deltas, sizes, aggregate), forget, forgotten_mean_norm=float(gone.norm())
    )
    assert exact == pytest.approx(true, rel=1e-6, abs=1e-9)  # ||m_u|| known: the bound is exact
    assert forgotten_influence_bound(_records(deltas, sizes, aggregate), frozenset({99})) == 0.0


def test_bounded_counts_every_round_with_a_forgotten_client(late_run):
    result, _ = recover(late_run, {"rollback": "bounded", "final_rounds": 0})
    paper, _ = recover(late_run, {"rollback": "paper", "final_rounds": 0})
    d = result.details
    with UnlearnSession(late_run) as session:
        forget = set(session.run_view.malicious)
        taking_part = {
            t
            for t in range(1, d.rollback_round + 1)
            if any(
                r.client_id in forget and r.status == "accepted"
                for r in session.run_view.store.client_records(t)
            )
        }
    assert taking_part <= {int(t) for t in d.round_bounds}
    assert all(b > 0 for b in d.round_bounds.values())
    assert d.cumulative_sensitivity[-1] >= paper.details.cumulative_sensitivity[-1]
    assert d.threshold == paper.details.threshold  # Φ is the paper's


def test_bounded_refuses_other_aggregators_and_runs_without_the_scalars(run_all):
    crab = make_method("crab", {"rollback": "bounded"})
    with UnlearnSession(run_all) as session:
        request = UnlearnRequest.of(sorted(session.run_view.malicious), "recover")
        context = session.context(request)
        context.training = TrainingInfo(aggregator="median")
        with pytest.raises(ConfigError, match="FedAvg"):
            crab.unlearn(request, context)
        context = session.context(request)
        stripped = context.history
        original = stripped.client_records

        def no_scalars(round_):
            return [replace(r, scalars={}) for r in original(round_)]

        stripped.client_records = no_scalars  # a run recorded by an older fedunlearn
        with pytest.raises(UnsupportedHistoryError, match="dot_aggregate"):
            crab.unlearn(request, context)
        assert context.meter.costs.client_epochs == 0  # refused before any work


# ----- final tuning [CB13] ----------------------------------------------------------------------


@pytest.mark.slow
def test_final_rounds_add_fedavg_rounds_of_the_remaining_clients(run_all):
    base, _ = recover(run_all, {"final_rounds": 0})
    tuned, _ = recover(run_all, {"final_rounds": 3})
    assert tuned.details.final_rounds == 3
    assert tuned.costs.rounds == base.costs.rounds + 3
    remaining = 5 - 1  # full participation: every remaining client, E = 2 epochs
    assert tuned.costs.client_epochs == base.costs.client_epochs + 3 * remaining * 2
    assert [r["round"] for r in tuned.round_metrics[-3:]] == [6, 7, 8]  # new rounds T+1..T+3
    assert not torch.equal(tuned.params, base.params)


@pytest.mark.slow
def test_auto_final_rounds_fill_the_skipped_rounds_within_the_epoch_budget(late_run):
    result, _ = recover(late_run)
    d = result.details
    with UnlearnSession(late_run) as session:
        request = UnlearnRequest.of(sorted(session.run_view.malicious), "recover")
        retrain = session.run(make_method("retrain"), request)
    replayed = sum(1 for ids in d.participants.values() if ids)
    skipped = LATE["training"]["rounds"] - d.rollback_round - replayed
    assert 0 < d.final_rounds <= skipped
    assert result.costs.client_epochs <= 0.6 * retrain.costs.client_epochs
    per_round = math.ceil(0.5 * 8) * 2  # half of the 8 remaining clients, E = 2
    assert (
        d.final_rounds == skipped
        or result.costs.client_epochs + per_round > 0.6 * retrain.costs.client_epochs
    )  # auto stops at the skipped rounds or at the budget, whichever comes first
