"""Sharded training and ``shard_retrain`` (SISA for FL): only the shards with the data retrain."""

from __future__ import annotations

import pytest
import torch

from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError, UnsupportedHistoryError
from fedunlearn.fl.engine import run_rounds
from fedunlearn.fl.shards import ShardPlan, combine
from fedunlearn.runs import train_run
from fedunlearn.runs.setup import build_setup, shard_plan
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

BASE = {
    "seed": 2,
    "data": {"dataset": "digits", "num_clients": 12},
    "model": {"name": "logreg"},
    "history": {"policy": "all"},
}
FRACTION = {"rounds": 5, "lr": 0.3, "batch_size": 8, "participation": 0.5, "shards": 3}
TV = {**FRACTION, "sampling": "tv_stable", "local_steps": 2}


def _config(training):
    return parse_config({**BASE, "training": {**training, "executor": "serial"}})


@pytest.fixture(scope="module", params=["fraction", "tv_stable"])
def sharded(request, tmp_path_factory):
    training = FRACTION if request.param == "fraction" else TV
    path = tmp_path_factory.mktemp(request.param) / "run"
    train_run(_config(training), path)
    return request.param, training, path


def test_the_balanced_split_is_seeded_and_even():
    plan = ShardPlan.balanced(range(10), 3, seed=4)
    assert plan == ShardPlan.balanced(range(10), 3, seed=4)
    assert sorted(len(plan.members(s)) for s in plan.shards) == [3, 3, 4]
    assert sorted(c for s in plan.shards for c in plan.members(s)) == list(range(10))
    assert plan.touched([0, 1]) <= set(plan.shards)


@pytest.mark.parametrize(
    ("training", "message"),
    [
        ({"shards": 20}, "exceeds data.num_clients"),
        ({"shards": 2, "shard_map": {0: 0, 1: 1}}, "assign every client"),
        ({"shards": 1, "shard_map": {0: 0}}, "needs training.shards > 1"),
        ({"shards": 2, "shard_map": {c: 0 for c in range(12)}}, "without clients"),
    ],
)
def test_bad_shard_configs_are_one_line_errors(training, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({**BASE, "training": training})


def test_the_run_s_model_combines_its_stored_shard_models(sharded):
    _, training, path = sharded
    with UnlearnSession(path, evaluate=False) as session:
        store = session.run_view.store
        for round_ in (1, 5):
            models = {s: store.read_shard_model(round_, s) for s in range(3)}
            assert torch.equal(store.read_model(round_), combine(models))
        metrics = store.round_scalars(5)
    assert 0 < metrics["ensemble_test_accuracy"] <= 1
    assert 0 < metrics["test_accuracy"] <= 1


@pytest.mark.slow
def test_shard_retrain_retrains_only_the_client_s_shard_and_equals_retrain(sharded):
    kind, training, path = sharded
    config = _config(training)
    plan = shard_plan(config)
    request = UnlearnRequest.of([3])
    with UnlearnSession(path, evaluate=False) as session:
        result = session.run(make_method("shard_retrain"), request)
        retrain = session.run(make_method("retrain"), request)
        final_shards = {s: session.run_view.store.read_shard_model(5, s) for s in range(3)}
    assert torch.equal(result.params, retrain.params)
    assert result.lineage.kind == "exact"
    assert set(result.details.retrained_shards) == {str(plan.shard_of[3])}
    # the other shards keep their stored models in the new history
    last = result.trajectory.rounds[-1]
    for s in range(3):
        if s != plan.shard_of[3]:
            assert torch.equal(last.shard_models[s], final_shards[s])
    assert result.costs.client_participations < retrain.costs.client_participations
    if kind == "tv_stable":  # then also training from scratch without the client, bit for bit
        setup = build_setup(config)
        try:
            scratch = run_rounds(
                setup.federation,
                setup.aggregator,
                setup.initial_params,
                num_rounds=5,
                client_ids=[c for c in range(12) if c != 3],
                sharding=setup.sharding(),
            )
        finally:
            setup.close()
        assert torch.equal(scratch, result.params)


def test_approximate_methods_refuse_a_sharded_run(sharded):
    _, _, path = sharded
    with UnlearnSession(path, evaluate=False) as session:
        with pytest.raises(UnsupportedHistoryError, match="isolated shards"):
            session.run(make_method("fedrecover"), UnlearnRequest.of([3]))


def test_on_an_unsharded_run_shard_retrain_is_tv_exact(tmp_path):
    train_run(_config({**TV, "shards": 1, "rounds": 3}), tmp_path / "run")
    with UnlearnSession(tmp_path / "run", evaluate=False) as session:
        a = session.run(make_method("shard_retrain"), UnlearnRequest.of([3]))
        b = session.run(make_method("tv_exact"), UnlearnRequest.of([3]))
    assert torch.equal(a.params, b.params)
    assert a.details.recomputed_from_round == b.details.recomputed_from_round


def test_forget_before_apply_on_a_sharded_run_is_refused_in_one_line(sharded, tmp_path):
    import shutil

    from fedunlearn.runs.forget import forget_clients

    _, _, path = sharded
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    with pytest.raises(ConfigError, match="apply a shard_retrain"):
        forget_clients(copy, [3])
