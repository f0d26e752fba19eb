"""Methods serve a request on a history that is an earlier result's trajectory (an applied result).

The history (``trajectory_support``): M_0, FedRecover's trajectory forgetting client 1 (with
estimated rounds), then rounds trained further without client 1. The second request forgets the
attacker and client 1 (cumulative): every method reads L = the store's rounds, not the config's T.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from trajectory_support import context_on, continue_training, write_trajectory

from fedunlearn.errors import UnsupportedHistoryError
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

pytestmark = pytest.mark.slow

FIRST = UnlearnRequest.of([1])
FEDRECOVER = {"warmup_rounds": 3, "final_rounds": 1, "correction_period": None}
MORE_ROUNDS = 2


@pytest.fixture(scope="module")
def generation(run_all, tmp_path_factory):
    """(session, store of generation 2, the second request)."""
    with UnlearnSession(run_all, evaluate=False) as session:
        first = session.run(make_method("fedrecover", FEDRECOVER), FIRST)
        assert first.trajectory is not None
        assert first.trajectory.estimated_updates() > 0
        store = write_trajectory(tmp_path_factory.mktemp("gen") / "h", session, first.trajectory)
        continue_training(store, session, FIRST.forget, MORE_ROUNDS)
        second = UnlearnRequest.of([*FIRST.forget, *session.run_view.malicious], "recover")
        yield session, store, second
        store.close()


def _run(generation, name, params=None):
    session, store, request = generation
    context = context_on(store, session, request)
    return context, make_method(name, params).unlearn(request, context)


@pytest.mark.parametrize("name", ["retrain", "fedrecover", "federaser", "crab"])
def test_method_serves_the_request_on_the_applied_history(generation, name):
    session, store, request = generation
    context, result = _run(generation, name, FEDRECOVER if name == "fedrecover" else None)
    rounds = session.run_view.config.training.rounds + MORE_ROUNDS
    assert context.num_rounds == rounds
    assert result.trajectory is not None
    assert result.trajectory.forgotten == request.forget
    assert torch.equal(result.trajectory.final_model, result.params)
    assert torch.isfinite(result.params).all()
    assert result.costs.client_epochs > 0


def test_fedrecover_replays_every_round_of_the_applied_history(generation):
    context, result = _run(generation, "fedrecover", FEDRECOVER)
    assert result.details.schedule["num_rounds"] == context.num_rounds
    assert result.trajectory.length == context.num_rounds
    assert result.details.estimated_updates > 0


def test_retrain_on_the_applied_history_redoes_the_original_rounds(generation, run_all):
    session, _, request = generation
    _, result = _run(generation, "retrain")
    direct = session.run(make_method("retrain"), request)
    # rounds 1..T of the applied history are the original rounds' seeds and participants
    round_t = result.trajectory.rounds[session.run_view.config.training.rounds - 1]
    assert torch.equal(round_t.global_model, direct.params)
    assert result.trajectory.length == direct.trajectory.length + MORE_ROUNDS


def test_federaser_keeps_the_stored_marks_of_its_uncalibrated_first_round(generation):
    session, store, _ = generation
    _, result = _run(generation, "federaser")
    stored = {c.client_id: c.scalars["estimated"] for c in store.client_records(1)}
    first = {c.client_id: c.scalars["estimated"] for c in result.trajectory.rounds[0].clients}
    assert first == {c: stored[c] for c in first}


@pytest.fixture(scope="module")
def applied_run(run_all, tmp_path_factory):
    """The shared run with FedRecover's trajectory (forgetting client 1) applied, trained on."""
    from fedunlearn.history.store import HistoryStore
    from fedunlearn.runs import HISTORY_DIR, continue_run

    copy = tmp_path_factory.mktemp("applied") / "run"
    shutil.copytree(run_all, copy)
    with UnlearnSession(copy, evaluate=False) as session:
        result = session.run(make_method("fedrecover", FEDRECOVER), FIRST)
    with HistoryStore.open(copy / HISTORY_DIR, writable=True) as store:
        store.apply(
            forget=FIRST.forget,
            new=FIRST.forget,
            method="fedrecover",
            request_kind="forget",
            model=result.params,
            model_sha256="",
            trajectory=result.trajectory.rounds,
        )
    continue_run(copy, MORE_ROUNDS)
    return copy


@pytest.mark.parametrize("name", ["fedadp", "starfish"])
def test_a_method_needing_the_trained_rounds_refuses_an_applied_history(applied_run, name):
    with UnlearnSession(applied_run, evaluate=False) as session:
        request = UnlearnRequest.of([4])
        context = session.context(request)
        before = context.meter.costs
        with pytest.raises(UnsupportedHistoryError) as err:
            make_method(name).unlearn(request, context)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{name} needs the rounds the run recorded as it trained")
    assert "Use crab, federaser, fedrecover, random, retrain, shard_retrain or tv_exact." in message
    assert context.meter.costs == before  # refused before any work


def test_the_serving_methods_run_on_the_applied_history(applied_run):
    with UnlearnSession(applied_run, evaluate=False) as session:
        result = session.run(make_method("crab"), UnlearnRequest.of([4], "recover"))
    assert result.trajectory is not None
    assert result.trajectory.forgotten == frozenset({1, 4})


def test_the_client_test_reads_every_round_of_the_applied_history(applied_run, base_config):
    from fedunlearn.eval.mia.client_lira import _run_participants

    with UnlearnSession(applied_run, evaluate=False) as session:
        participants = _run_participants(session)
        assert session.run_view.num_rounds == base_config["training"]["rounds"] + MORE_ROUNDS
        assert len(participants) == session.run_view.num_rounds
        assert all(1 not in p for p in participants)


def test_the_applied_store_keeps_the_estimated_marks(applied_run, base_config):
    with UnlearnSession(applied_run, evaluate=False) as session:
        store = session.run_view.store
        marks = [
            c.scalars.get("estimated")
            for r in range(1, base_config["training"]["rounds"] + 1)
            for c in store.client_records(r)
        ]
    assert marks.count(True) > 0  # FedRecover's estimates, as the trajectory marked them
    assert set(marks) == {True, False}
