"""Crab's selective storage: KL, windows, selection counts, deferred writes, resume."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError, HistoryError
from fedunlearn.history import ClientRecord, HistoryStore, RoundEntry
from fedunlearn.runs import train_run
from fedunlearn.unlearn.crab.policy import (
    ReferenceScorer,
    WindowSelector,
    clients_to_keep,
    close_windows,
    kl_divergence,
    rounds_to_keep,
    select_clients,
    select_rounds,
    window_bound,
)

CONFIG = {
    "seed": 3,
    "data": {"dataset": "digits", "num_clients": 5},
    "model": {"name": "mlp", "hidden": [16]},
    "training": {"rounds": 8, "local_epochs": 1, "lr": 0.3, "batch_size": 32, "executor": "serial"},
    "attack": {"kind": "backdoor", "num_malicious": 1, "trigger_size": 3},
    "history": {"policy": "crab", "crab": {"alpha": 0.3, "reference_size": 400}},
}


def stored_sets(run_dir):
    with HistoryStore.open(run_dir / "history") as store:
        return {
            r: tuple(c.client_id for c in store.client_records(r) if c.stored)
            for r in store.rounds()
        }


# ----- V0: KL, windows, selection counts ------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 20), st.integers(2, 10), st.integers(0, 2**31 - 1))
def test_kl_is_zero_on_itself_and_nonnegative(rows, classes, seed):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(3 * torch.randn(rows, classes, generator=g), dim=1)
    q = torch.softmax(3 * torch.randn(rows, classes, generator=g), dim=1)
    assert kl_divergence(p, p) == 0.0
    assert kl_divergence(p, q) >= 0.0


def test_windows_close_where_loss_fell_by_alpha_and_count_within_bound():
    losses = [2.30, 2.10, 2.06, 1.90, 1.80, 1.70, 1.72, 1.50, 1.49, 1.48]
    closes = close_windows(losses, alpha=0.1)
    # 2.06 <= 0.9*2.30 = 2.07 closes at 2; then <= 0.9*2.06 = 1.854 at 4; <= 0.9*1.80 at 7
    assert closes == [2, 4, 7]
    for t in range(1, len(losses)):
        assert (t in closes) == (losses[t] <= 0.9 * losses[max([0, *[c for c in closes if c < t]])])
    bound = window_bound(losses[0], losses[closes[-1]], alpha=0.1)
    assert len(closes) <= bound == math.floor(math.log(1.50 / 2.30) / math.log(0.9))
    assert close_windows([2.0, 2.1, 2.2, 2.3], alpha=0.1) == []  # rising loss: never closes
    assert close_windows([2.0, 2.1, 2.2, 2.3], alpha=0.1, max_window=2) == [2]


@pytest.mark.parametrize("window", [1, 2, 3, 5, 7, 10])
@pytest.mark.parametrize("ratio", [0.3, 0.5, 0.6, 1.0])
def test_round_selection_keeps_max_1_round_half_up_and_the_highest_scores(window, ratio):
    scores = {t: float((7 * t) % 11) for t in range(1, window + 1)}
    kept = select_rounds(scores, ratio)
    assert len(kept) == max(1, math.floor(ratio * window + 0.5 + 1e-9))
    assert kept == sorted(kept)
    assert min(scores[t] for t in kept) >= max(
        (scores[t] for t in scores if t not in kept), default=-1
    )
    assert rounds_to_keep(window, ratio, "floor") == max(1, math.floor(ratio * window + 1e-9))


@pytest.mark.parametrize("num_clients", [1, 5, 10, 20])
@pytest.mark.parametrize("ratio", [0.5, 0.7, 1.0])
def test_client_selection_keeps_floor_delta_c_most_aligned(num_clients, ratio):
    g = torch.Generator().manual_seed(num_clients)
    agg = torch.randn(50, generator=g)
    noise = torch.randn(50, generator=g)
    noise -= (noise @ agg) / (agg @ agg) * agg  # orthogonal to the aggregate
    # client c: cosine 1 / sqrt(1 + c^2 |noise|^2 / |agg|^2), decreasing in c
    updates = {c: agg * (1 + c % 3) + noise * c * (1 + c % 3) for c in range(num_clients)}
    kept = select_clients(updates, agg, ratio)
    expected = max(1, math.floor(ratio * num_clients + 1e-9))
    assert len(kept) == clients_to_keep(num_clients, ratio) == expected
    assert kept == list(range(len(kept)))  # client c has noise c: lower ids are more aligned
    assert clients_to_keep(20, 0.7) == 14


# ----- store: attaching a window's updates to earlier rounds ----------------------------------


def _entry(r, clients=(0, 1), updates=None):
    return RoundEntry(
        r,
        global_model=torch.full((4,), float(r)),
        aggregate=torch.ones(4),
        updates=updates or {},
        clients=[ClientRecord(c, "accepted", num_samples=3) for c in clients],
    )


def test_attached_updates_commit_with_the_round_and_are_checked(tmp_path):
    store = HistoryStore.create(tmp_path, {"seed": 0})
    store.write_round(RoundEntry(0, global_model=torch.zeros(4)))
    store.write_round(_entry(1))
    store.write_round(_entry(2))
    with pytest.raises(HistoryError, match="no reply recorded"):
        store.write_round(_entry(3), attach={1: {7: torch.ones(4)}})
    with pytest.raises(ConfigError, match="earlier rounds"):
        store.write_round(_entry(3), attach={3: {0: torch.ones(4)}})
    assert store.last_round() == 2
    assert not store.has_update(1, 0)  # nothing written
    store.write_round(_entry(3, updates={1: torch.ones(4)}), attach={1: {0: torch.ones(4) * 5}})
    assert torch.equal(store.read_update(1, 0), torch.ones(4) * 5)
    assert store.has_update(3, 1)
    assert not store.has_update(2, 0)
    with pytest.raises(HistoryError, match="already stores"):
        store.write_round(_entry(4), attach={1: {0: torch.ones(4)}})
    store.forget([1])
    with pytest.raises(HistoryError, match="forgotten"):
        store.write_round(_entry(4), attach={2: {1: torch.ones(4)}})
    assert store.last_round() == 3
    store.verify()
    store.close()


# ----- live policy: only the selection is written; resume ------------------------------------


@pytest.fixture(scope="module")
def crab_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("crab") / "run"
    train_run(parse_config(CONFIG), run_dir)
    return run_dir


def test_live_policy_writes_only_the_window_selection(crab_run):
    sets = stored_sets(crab_run)
    assert sets[0] == ()
    kept = {r: ids for r, ids in sets.items() if ids}
    assert 8 in [r for r in sets]  # every global model is kept
    assert 1 <= len(kept) < 8  # λ = 0.6 drops rounds
    assert all(len(ids) == 3 for ids in kept.values())  # floor(0.7 * 5)
    with HistoryStore.open(crab_run / "history") as store:
        assert all(store.read_model(r).numel() > 0 for r in range(9))
        d = store.read_model(0).numel()
        n_updates = sum(len(ids) for ids in kept.values())
        assert store.stored_bytes_by_kind()["update"] == n_updates * d * 4


class StopAt:
    def __init__(self, round_):
        self.round_ = round_

    def on_round_end(self, record):
        if record.round == self.round_:
            raise KeyboardInterrupt


def test_interrupted_crab_run_restarts_at_the_window_and_is_bit_identical(crab_run, tmp_path):
    cfg = parse_config(CONFIG)
    full = stored_sets(crab_run)
    closes = sorted(r for r, ids in full.items() if ids)  # some round of each closed window
    stop = 7
    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, tmp_path / "cut", observers=[StopAt(stop)])
    summary = train_run(cfg, tmp_path / "cut", resume=True)
    # windows close at rounds 5 and 8 here: round 7 is mid-window, so rounds 6-7 are re-run
    assert summary["resumed_from_round"] == 5 < stop
    assert closes
    assert stored_sets(tmp_path / "cut") == full
    with (
        HistoryStore.open(crab_run / "history") as a,
        HistoryStore.open(tmp_path / "cut" / "history") as b,
    ):
        for r in range(9):
            assert torch.equal(a.read_model(r), b.read_model(r))
            for cid in full[r]:
                assert torch.equal(a.read_update(r, cid), b.read_update(r, cid))
    lines = (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 8


@pytest.mark.slow
def test_kill_9_mid_window_then_resume_gives_the_uninterrupted_store(crab_run, tmp_path):
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(CONFIG))
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "fedunlearn.cli.main", "train", str(cfg_path), "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the test runs beside an xdist worker
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 120
    metrics = out / "metrics.jsonl"
    while time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 4:
            break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with HistoryStore.open(out / "history") as store:
        done = store.last_round()
    assert done is not None
    assert 4 <= done <= 8
    train_run(parse_config(CONFIG), out, resume=True)  # in-process: saves a torch start-up
    assert stored_sets(out) == stored_sets(crab_run)
    with (
        HistoryStore.open(crab_run / "history") as a,
        HistoryStore.open(out / "history") as b,
    ):
        b.verify()
        assert torch.equal(a.read_model(8), b.read_model(8))


@pytest.mark.parametrize("divergence", ["pred_kl", "param_softmax_kl"])
def test_round_scores_are_zero_for_an_unchanged_model_and_positive_otherwise(divergence):
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 12, generator=g), torch.randint(0, 3, (40,), generator=g)
    scorer = ReferenceScorer(model, x, y, divergence)
    params = torch.randn(39, generator=g)
    same, moved = scorer.view(params), scorer.view(params + 0.5 * torch.randn(39, generator=g))
    assert scorer.divergence(same, scorer.view(params.clone())) == 0.0
    assert scorer.divergence(same, moved) > 0.0
    assert same.loss > 0
    with pytest.raises(ConfigError, match="divergence must be"):
        ReferenceScorer(model, x, y, "kl")  # type: ignore[arg-type]


# ----- Eq. 1's direction [CB1]: the review's surviving mutant ----------------------------------


def _expanded_kl(p_old: torch.Tensor, p_new: torch.Tensor) -> float:
    """Σ p(M_t) log(p(M_t) / p(M_{t+1})), averaged over rows: Eq. 1 as the paper expands it."""
    return float((p_old * (p_old / p_new).log()).sum(dim=1).mean())


def test_kl_divergence_is_the_expanded_form_of_eq1():
    p_old = torch.tensor([[0.9, 0.1], [0.5, 0.5]], dtype=torch.float64)
    p_new = torch.tensor([[0.5, 0.5], [0.2, 0.8]], dtype=torch.float64)
    expected = _expanded_kl(p_old, p_new)
    reverse = _expanded_kl(p_new, p_old)
    assert abs(expected - reverse) > 0.05  # the two directions differ on this pair
    assert kl_divergence(p_old, p_new) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("divergence", ["pred_kl", "param_softmax_kl"])
def test_round_score_is_kl_of_the_previous_model_against_the_new_one(divergence):
    # Prepare: three global models M_0, M_1, M_2 of a linear classifier (small weights, so no
    # probability reaches the 1e-12 clamp); a window of two rounds
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(6, 3))
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(30, 6, generator=g), torch.randint(0, 3, (30,), generator=g)
    scorer = ReferenceScorer(model, x, y, divergence)
    models = [torch.randn(21, generator=g) * s for s in (0.3, 0.8, 1.2)]
    selector = WindowSelector(scorer, alpha=1e-6, round_ratio=1.0, client_ratio=1.0, max_window=2)
    selector.start(models[0])
    # Execute
    for t in (1, 2):
        selector.observe(t, models[t], models[t] - models[t - 1], lambda: {0: torch.ones(21)})
    # Assert: round t's score is D(M_{t-1}, M_t) = KL(p(M_{t-1}) || p(M_t)), not the reverse
    for t, score in zip((1, 2), selector.windows[0].scores, strict=True):
        old, new = scorer.view(models[t - 1]), scorer.view(models[t])
        if divergence == "pred_kl":
            p_old, p_new = old.probs, new.probs
            assert score == pytest.approx(_expanded_kl(p_old, p_new), rel=1e-9)
            assert abs(score - _expanded_kl(p_new, p_old)) > 1e-3 * score
        else:
            forward = scorer.divergence(old, new)
            assert score == pytest.approx(forward, rel=1e-12)
            first = slice(0, 18)  # the weight matrix (3 x 6): row-wise softmax over its columns
            a = torch.softmax(models[t - 1][first].reshape(3, 6).double(), dim=1)
            b = torch.softmax(models[t][first].reshape(3, 6).double(), dim=1)
            c = torch.softmax(models[t - 1][18:].reshape(1, 3).double(), dim=1)
            d = torch.softmax(models[t][18:].reshape(1, 3).double(), dim=1)
            assert score == pytest.approx(_expanded_kl(a, b) + _expanded_kl(c, d), rel=1e-9)
            assert abs(score - (_expanded_kl(b, a) + _expanded_kl(d, c))) > 1e-3 * score
