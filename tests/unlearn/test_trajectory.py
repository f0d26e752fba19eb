"""The trajectories Retrain, FedRecover, FedEraser and Crab return (``UnlearnResult.trajectory``).

Each round of a trajectory is consistent (model = previous model + aggregate; the aggregate is the
run's rule over the round's updates, weighted by n_c), no forgotten client appears, estimated
updates are marked, the trajectory rebuilds the method's model bit for bit, and the model repeats
bit for bit when the method runs again. Both sides of every comparison are computed here, on the
machine that runs the test: float32 kernels round differently on other CPUs (AVX-512 and AVX2
kernels of the same torch wheel), so a digest recorded on one machine proves nothing on another
(issue 42; ``tests/test_no_pinned_digests.py`` keeps such digests out).
"""

from __future__ import annotations

import pytest
import torch

from fedunlearn.fl.engine import run_rounds
from fedunlearn.history.policy import HistoryRecorder, RecordAll
from fedunlearn.history.store import HistoryStore, RoundEntry
from fedunlearn.history.trajectory import ESTIMATED_KEY
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

pytestmark = pytest.mark.slow

FORGET = UnlearnRequest.of([1])
FEDRECOVER_ESTIMATING = {"warmup_rounds": 3, "final_rounds": 1, "correction_period": None}
METHODS = ("crab", "federaser", "fedrecover", "retrain")


def _method(name):
    return make_method(name, FEDRECOVER_ESTIMATING if name == "fedrecover" else None)


@pytest.fixture(scope="module")
def results(run_all):
    with UnlearnSession(run_all, evaluate=False) as session:
        yield session, {m: session.run(_method(m), FORGET) for m in METHODS}


@pytest.mark.parametrize("name", METHODS)
def test_the_trajectory_rebuilds_the_model_bit_for_bit(results, name):
    session, by_method = results
    result = by_method[name]
    assert result.trajectory is not None
    rebuilt = session.run_view.initial_params
    for entry in result.trajectory.rounds:
        rebuilt = rebuilt + entry.aggregate
    assert torch.equal(rebuilt, result.params)
    assert torch.equal(result.trajectory.final_model, result.params)


@pytest.mark.parametrize("name", METHODS)
def test_the_model_repeats_bit_for_bit_in_a_new_session(results, run_all, name):
    with UnlearnSession(run_all, evaluate=False) as again:
        second = again.run(_method(name), FORGET)
    assert torch.equal(second.params, results[1][name].params)
    assert second.trajectory is not None
    assert second.trajectory.length == results[1][name].trajectory.length


@pytest.mark.parametrize("name", METHODS)
def test_each_round_applies_the_rule_to_its_updates(results, name):
    session, by_method = results
    trajectory = by_method[name].trajectory
    sizes = session.run_view.client_sizes
    previous = session.run_view.initial_params
    for entry in trajectory.rounds:
        assert torch.equal(entry.global_model, previous + entry.aggregate)
        ids = [c.client_id for c in entry.clients if c.status == "accepted"]
        assert sorted(ids) == sorted(entry.updates)
        deltas = torch.stack([entry.updates[c] for c in ids])
        weights = torch.tensor([float(sizes[c]) for c in ids])
        assert torch.allclose(session._aggregator(deltas, weights), entry.aggregate, atol=1e-7)
        assert all(c.num_samples == sizes[c.client_id] for c in entry.clients)
        previous = entry.global_model


@pytest.mark.parametrize("name", METHODS)
def test_no_forgotten_client_appears(results, name):
    trajectory = results[1][name].trajectory
    assert trajectory.forgotten == FORGET.forget
    for entry in trajectory.rounds:
        assert not FORGET.forget & ({c.client_id for c in entry.clients} | set(entry.updates))


def _marks(trajectory):
    return [{c.client_id: c.scalars[ESTIMATED_KEY] for c in e.clients} for e in trajectory.rounds]


def test_fedrecover_marks_its_estimates_only(results):
    result = results[1]["fedrecover"]
    marks = _marks(result.trajectory)
    assert result.trajectory.length == 5
    assert result.trajectory.estimated_updates() == result.details.estimated_updates > 0
    for round_, mark in enumerate(marks, start=1):
        if round_ in result.details.exact_rounds:
            assert not any(mark.values())


def test_federaser_marks_calibrated_updates_not_the_first_round(results):
    result = results[1]["federaser"]
    marks = _marks(result.trajectory)
    assert result.trajectory.length == len(result.details.retained_rounds)
    assert not any(marks[0].values())
    assert all(all(m.values()) for m in marks[1:])


def test_crab_replay_is_estimated_and_final_tuning_rounds_are_extra_fresh_rounds(results):
    session, _ = results
    result = session.run(make_method("crab", {"final_rounds": 2}), FORGET)
    details = result.details
    marks = _marks(result.trajectory)
    replayed = [r for r in details.recovery_rounds if details.participants[str(r)]]
    assert details.final_rounds > 0
    assert result.trajectory.length == details.rollback_round + len(replayed) + details.final_rounds
    assert all(all(m.values()) for m in marks[details.rollback_round : -details.final_rounds])
    assert not any(any(m.values()) for m in marks[-details.final_rounds :])


def test_forgetting_nobody_returns_no_trajectory(run_all):
    with UnlearnSession(run_all, evaluate=False) as session:
        result = session.run(make_method("fedrecover"), UnlearnRequest.of([]))
    assert result.trajectory is None


def test_retrain_s_trajectory_is_the_history_of_training_without_the_client(results, tmp_path):
    session, by_method = results
    trajectory = by_method["retrain"].trajectory
    run = session.run_view
    applied = HistoryStore.create(tmp_path / "applied", {})
    applied.write_round(RoundEntry(round=0, global_model=run.initial_params))
    for entry in trajectory.rounds:
        applied.write_round(entry)
    trained = HistoryStore.create(tmp_path / "trained", {})
    trained.write_round(RoundEntry(round=0, global_model=run.initial_params))
    run_rounds(
        session.federation,
        session._aggregator,
        run.initial_params,
        num_rounds=run.config.training.rounds,
        client_ids=[c for c in session.federation.client_ids if c not in FORGET.forget],
        observers=[HistoryRecorder(trained, RecordAll())],
    )
    assert applied.rounds() == trained.rounds()
    assert torch.equal(by_method["retrain"].params, trained.read_model(trained.rounds()[-1]))
    for r in trained.rounds()[1:]:
        assert torch.equal(applied.read_model(r), trained.read_model(r))
        assert torch.equal(applied.read_model(r, "aggregate"), trained.read_model(r, "aggregate"))
        expected = dict(trained.iter_updates(r))
        got = dict(applied.iter_updates(r))
        assert sorted(got) == sorted(expected)
        assert all(torch.equal(got[c], expected[c]) for c in expected)
        want = [(c.client_id, c.num_samples, c.norm) for c in trained.client_records(r)]
        assert [(c.client_id, c.num_samples, c.norm) for c in applied.client_records(r)] == want
    applied.close()
    trained.close()


PARTIAL = {
    "seed": 3,
    "data": {"dataset": "digits", "num_clients": 10},
    "model": {"name": "mlp", "hidden": [16]},
    "training": {
        "rounds": 6,
        "local_epochs": 1,
        "lr": 0.3,
        "batch_size": 32,
        "participation": 0.3,
        "executor": "serial",
    },
    "history": {"policy": "all"},
}


def test_crab_keeps_the_run_s_rounds_before_its_rollback_point(tmp_path):
    from fedunlearn.config import parse_config
    from fedunlearn.runs import train_run

    train_run(parse_config(PARTIAL), tmp_path / "run")
    with UnlearnSession(tmp_path / "run", evaluate=False) as session:
        store = session.run_view.store
        first = {}
        for r in range(1, 7):
            for c in store.client_records(r):
                first.setdefault(c.client_id, r)
        late = max(first, key=lambda c: (first[c], -c))  # the client that took part last
        result = session.run(make_method("crab"), UnlearnRequest.of([late]))
        t_star = result.details.rollback_round
        assert 0 < t_star < first[late]
        kept = result.trajectory.rounds[:t_star]
        for entry in kept:
            assert torch.equal(entry.global_model, store.read_model(entry.round))
            assert torch.equal(entry.aggregate, store.read_model(entry.round, "aggregate"))
            assert sorted(entry.updates) == sorted(c for c, _ in store.iter_updates(entry.round))
            assert not any(c.scalars[ESTIMATED_KEY] for c in entry.clients)
        assert torch.equal(result.trajectory.final_model, result.params)


def test_crab_returns_no_trajectory_when_its_rollback_model_saw_the_client(results):
    import dataclasses

    from fedunlearn.unlearn.crab.unlearner import Crab

    class LateRollback(Crab):
        """Crab rolled back to its last-but-one stored round, past the client's first round."""

        def rollback(self, context, stored, forget):
            rb = super().rollback(context, stored, forget)
            return dataclasses.replace(rb, index=len(stored) - 1)

    session, _ = results
    result = session.run(LateRollback(), FORGET)
    assert not result.details.rollback_free_of_forgotten
    assert result.trajectory is None
