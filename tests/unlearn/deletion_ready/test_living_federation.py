"""A deletion-ready run as a living federation: unlearn -> apply -> continue -> the next request.

The strongest statement the construction allows, tested bit for bit: after each applied exact
result and each continuation, the run's model is the model of training from scratch, with the
same seed and sampler, on the data that remains (issue 32, item 6).
"""

from __future__ import annotations

import json

import pytest
import torch

from fedunlearn.config import parse_config
from fedunlearn.experiments import save_for_apply, unlearn_one
from fedunlearn.fl.engine import run_rounds
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import HISTORY_DIR, train_run
from fedunlearn.runs.lifecycle import apply_result, continue_run
from fedunlearn.runs.setup import build_setup, sampler_of

pytestmark = pytest.mark.slow

BASE = {
    "seed": 1,
    "data": {"dataset": "digits", "num_clients": 12},
    "model": {"name": "logreg"},
    "history": {"policy": "all"},
}
TV = {
    "rounds": 6,
    "lr": 0.3,
    "batch_size": 4,
    "participation": 0.25,
    "sampling": "tv_stable",
    "local_steps": 2,
    "executor": "serial",
}


def _scratch(config, rounds, *, without=(), samples=None):
    setup = build_setup(config)
    try:
        fed = setup.federation if not samples else setup.federation.without_samples(samples)
        return run_rounds(
            fed,
            setup.aggregator,
            setup.initial_params,
            num_rounds=rounds,
            client_ids=[c for c in fed.client_ids if c not in without],
            sampler=sampler_of(config),
            sharding=setup.sharding(),
        )
    finally:
        setup.close()


def _unlearn_and_apply(run, tmp_path, name, method="tv_exact", forget=(), samples=None):
    result, summary = unlearn_one(run, list(forget), method, samples=samples, verify=False)
    out = tmp_path / f"{name}.json"
    save_for_apply(out, summary, result)
    out.write_text(json.dumps(summary))
    event = apply_result(run, out)
    return result, event


def _model(run):
    with HistoryStore.open(run / HISTORY_DIR) as store:
        return store.read_model(store.last_round())


@pytest.mark.parametrize("shards", [1, 3])
def test_requests_applied_and_continued_equal_training_on_what_remains(tmp_path, shards):
    config = parse_config({**BASE, "training": {**TV, "shards": shards}})
    run = tmp_path / "run"
    train_run(config, run)
    with HistoryStore.open(run / HISTORY_DIR) as store:
        before = {r: store.read_model(r) for r in store.rounds()}

    samples = {5: [0, 1, 2, 3, 40, 41]}
    result, event = _unlearn_and_apply(run, tmp_path, "s", samples=samples)
    kept = result.trajectory.kept
    assert event["kept_rounds"] == kept
    assert torch.equal(_model(run), _scratch(config, 6, samples=samples))
    with HistoryStore.open(run / HISTORY_DIR) as store:
        assert store.forgotten_samples() == {5: frozenset(samples[5])}
        for r in range(kept + 1):  # the kept rounds are the run's own, untouched
            assert torch.equal(store.read_model(r), before[r])

    continue_run(run, 3)
    assert torch.equal(_model(run), _scratch(config, 9, samples=samples))

    _unlearn_and_apply(run, tmp_path, "c", forget=[3])
    assert torch.equal(_model(run), _scratch(config, 9, without=[3], samples=samples))
    continue_run(run, 2)
    assert torch.equal(_model(run), _scratch(config, 11, without=[3], samples=samples))


def test_an_untouched_request_applies_without_replacing_any_round(tmp_path):
    config = parse_config({**BASE, "training": TV})
    run = tmp_path / "run"
    train_run(config, run)
    with HistoryStore.open(run / HISTORY_DIR) as store:
        drawn = {r.client_id for t in range(1, 7) for r in store.client_records(t)}
        payloads = store.stored_bytes()
    never = min(set(range(12)) - drawn)
    result, event = _unlearn_and_apply(run, tmp_path, "n", forget=[never])
    assert result.costs.client_participations == 0
    assert event["kept_rounds"] == 6
    assert event["dropped_payloads"] == 0
    with HistoryStore.open(run / HISTORY_DIR) as store:
        assert store.stored_bytes() == payloads
        assert store.forgotten_clients() == {never}
