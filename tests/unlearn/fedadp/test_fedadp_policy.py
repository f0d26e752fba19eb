"""FedADP's dual-layer selection: counts, rankings, stages, live policy = derived selection."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError
from fedunlearn.history import HistoryStore
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession
from fedunlearn.unlearn.fedadp.policy import (
    StageSelector,
    count_half_up,
    relu_cosine,
    select_clients,
    select_rounds,
    stage_ends,
)
from fedunlearn.unlearn.fedadp.unlearner import FedADP

CONFIG = {
    "seed": 4,
    "data": {"dataset": "digits", "num_clients": 6},
    "model": {"name": "mlp", "hidden": [16]},
    "training": {"rounds": 7, "local_epochs": 1, "lr": 0.3, "batch_size": 32, "executor": "serial"},
    "history": {"policy": "fedadp", "fedadp": {"beta": 0.1}},
    "privacy": {"enabled": True, "clip_norm": 0.5, "epsilon_max": 3.0},
}


def stored_sets(run_dir):
    with HistoryStore.open(run_dir / "history") as store:
        return {
            r: tuple(c.client_id for c in store.client_records(r) if c.stored)
            for r in store.rounds()
            if r > 0
        }


@pytest.mark.parametrize("n", range(1, 13))
def test_a_stage_of_n_rounds_keeps_round_half_up_of_lambda_n(n):
    assert count_half_up(n, 0.6) == max(1, math.floor(0.6 * n + 0.5))
    assert count_half_up(20, 0.7) == 14  # C' = 14 of 20 (the 1e-9 guard)


def test_relu_cosine_is_float64_and_zero_safe():
    a = torch.tensor([1.0, 0.0])
    assert relu_cosine(a, torch.tensor([-1.0, 0.0])) == 0.0  # ReLU
    assert relu_cosine(a, torch.zeros(2)) == 0.0
    big = torch.full((10_000,), 1.0)
    near = big.clone()
    near[0] = 1.001
    assert 0 < 1 - relu_cosine(big, near) < 1e-7  # resolved in float64


def test_kept_rounds_have_the_smallest_d_and_kept_updates_the_largest_cosine():
    scores = {1: 0.9, 2: 0.2, 3: 0.5, 4: 0.2, 5: 0.99}
    assert select_rounds(scores, 0.6) == [2, 3, 4]  # k = 3; ties: earlier round first
    g = torch.Generator().manual_seed(0)
    aggregate = torch.randn(50, generator=g)
    updates = {c: aggregate * (c + 1) / 20 + torch.randn(50, generator=g) for c in range(20)}
    kept = select_clients(updates, aggregate, 0.7)
    cos = {c: float(torch.cosine_similarity(u, aggregate, dim=0)) for c, u in updates.items()}
    assert len(kept) == 14
    assert min(cos[c] for c in kept) >= max(cos[c] for c in set(updates) - set(kept))


def test_stage_trigger_updates_prev_loss_at_every_flush():
    # (1 - beta) prev_loss with beta 0.1: 10 -> 9 ends, then 8.1 is the next bar
    assert stage_ends([10.0, 9.5, 9.0, 8.5, 8.1, 8.0], 0.1) == [2, 4]


def _feed(selector, losses, seed=0):
    """Feed rounds 1..T with ``losses[t] = L(M_t)`` to a started selector; return its stages."""
    g = torch.Generator().manual_seed(seed)
    models = [torch.randn(8, generator=g) for _ in losses]
    for t in range(1, len(losses)):
        ups = {c: torch.randn(8, generator=g) for c in range(5)}
        selector.observe(
            t,
            models[t - 1],
            models[t],
            sum(ups.values()),
            losses[t],
            ups,
            final=t == len(losses) - 1,
        )
    return selector.stages


def test_live_selector_resets_prev_loss_at_every_stage_end():
    # Issue 13: the reset in StageSelector.observe was untested (only stage_ends, the resume
    # path's copy, was). Without it the bar stays (1 - beta) L(M_0) = 9 and rounds 3, 4 and 5
    # each close a stage of their own; with it, round 2 (9.0) moves the bar to 8.1.
    selector = StageSelector(0.1, 0.6, 0.7)
    selector.start(10.0)
    stages = _feed(selector, [10.0, 9.5, 9.0, 8.5, 8.1, 8.0])
    assert [s.rounds for s in stages] == [(1, 2), (3, 4), (5,)]
    assert [s.closed for s in stages] == [True, True, False]  # round 5 is the final flush


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(0.1, 10), min_size=2, max_size=15), st.integers(0, 1000))
def test_selector_counts_per_stage_and_flushes_the_end(losses, seed):
    g = torch.Generator().manual_seed(seed)
    selector = StageSelector(0.1, 0.6, 0.7)
    selector.start(losses[0])
    models = [torch.randn(8, generator=g) for _ in losses]
    kept_all = {}
    for t in range(1, len(losses)):
        ups = {c: torch.randn(8, generator=g) for c in range(5)}
        kept = selector.observe(
            t,
            models[t - 1],
            models[t],
            sum(ups.values()),
            losses[t],
            ups,
            final=t == len(losses) - 1,
        )
        kept_all.update(kept or {})
    rounds = [r for s in selector.stages for r in s.rounds]
    assert rounds == list(range(1, len(losses)))  # every round in exactly one stage
    # the live selector closes exactly the stages that resume_round rebuilds from the losses
    assert [s.rounds[-1] for s in selector.stages if s.closed] == stage_ends(losses, 0.1)
    assert [s.closed for s in selector.stages[:-1]] == [True] * (len(selector.stages) - 1)
    for s in selector.stages:
        assert len(s.kept) == count_half_up(len(s.rounds), 0.6)
        kept_scores = [sc for r, sc in zip(s.rounds, s.scores, strict=True) if r in s.kept]
        other = [sc for r, sc in zip(s.rounds, s.scores, strict=True) if r not in s.kept]
        assert not other or max(kept_scores) <= min(other)
    assert all(len(ids) == 4 for ids in kept_all.values())  # round_half_up(0.7 * 5) = 4


def test_global_mode_keeps_round_lambda_t_rounds_once():
    selector = StageSelector(0.1, 0.6, 1.0, selection_mode="global", total_rounds=10)
    selector.start(10.0)
    g = torch.Generator().manual_seed(1)
    out = None
    for t in range(1, 11):
        out = selector.observe(
            t,
            torch.randn(4, generator=g),
            torch.randn(4, generator=g),
            torch.ones(4),
            10.0 / (t + 1),
            {0: torch.ones(4)},
            final=t == 10,
        )
        assert (out is None) == (t < 10)  # no stage trigger in global mode
    assert len(out) == 6


def test_bad_selector_options_are_rejected():
    with pytest.raises(ConfigError, match="model_align must be 'params' or 'updates'"):
        StageSelector(0.1, 0.6, 0.7, model_align="weights")


@pytest.fixture(scope="module")
def live_and_all(tmp_path_factory):
    root = tmp_path_factory.mktemp("fedadp_policy")
    live = root / "live"
    train_run(parse_config(CONFIG), live)
    full = root / "all"
    train_run(parse_config({**CONFIG, "history": {**CONFIG["history"], "policy": "all"}}), full)
    return live, full


@pytest.mark.slow
def test_live_policy_stores_exactly_the_selection_derived_from_the_full_history(live_and_all):
    live, full = live_and_all
    with UnlearnSession(full) as session:
        derived = FedADP().selection(session.context(UnlearnRequest.of([0]))).stored
    stored = {r: ids for r, ids in stored_sets(live).items() if ids}
    assert stored == {s.round: s.clients for s in derived}
    assert all(len(ids) == 4 for ids in stored.values())  # round_half_up(0.7 * 6)
    with HistoryStore.open(live / "history") as a, HistoryStore.open(full / "history") as b:
        assert torch.equal(a.read_model(7), b.read_model(7))  # the policy does not change training
        r = next(iter(stored))
        c = stored[r][0]
        assert torch.equal(a.read_update(r, c), b.read_update(r, c))


@pytest.mark.slow
def test_resumed_live_run_equals_the_uninterrupted_one(live_and_all, tmp_path):
    live, _ = live_and_all
    partial = tmp_path / "partial"
    train_run(parse_config({**CONFIG, "training": {**CONFIG["training"], "rounds": 7}}), partial)
    with HistoryStore.open(partial / "history", writable=True) as store:
        store.truncate_after(4)  # as if killed after round 4 (the open stage is lost)
    train_run(parse_config(CONFIG), partial, resume=True)
    assert stored_sets(partial) == stored_sets(live)
    with HistoryStore.open(partial / "history") as a, HistoryStore.open(live / "history") as b:
        assert torch.equal(a.read_model(7), b.read_model(7))
        assert a.stored_bytes() == b.stored_bytes()
        assert [a.round_scalars(r) for r in range(8)] == [b.round_scalars(r) for r in range(8)]
