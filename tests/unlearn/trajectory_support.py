"""A history that is a previous result's trajectory: written to a fresh store, read by a context.

Stands in for ``apply`` (the living federation): round 0 is the run's M_0, rounds 1..L the
trajectory's entries, optionally followed by rounds trained further from its final model by the
remaining clients (``continue_training``).
"""

from __future__ import annotations

from pathlib import Path

from fedunlearn.config import HistoryConfig
from fedunlearn.fl.engine import run_rounds
from fedunlearn.history.policy import HistoryRecorder, RecordAll
from fedunlearn.history.store import HistoryStore, RoundEntry
from fedunlearn.history.trajectory import Trajectory
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession
from fedunlearn.unlearn.context import (
    CostMeter,
    MeteredHistory,
    RemainingClients,
    TrainingInfo,
    UnlearnContext,
)


def write_trajectory(path: Path, session: UnlearnSession, trajectory: Trajectory) -> HistoryStore:
    """Return a writable store holding M_0 and the trajectory's rounds 1..L."""
    run = session.run_view
    store = HistoryStore.create(path, run.store.meta)
    store.write_round(RoundEntry(round=0, global_model=run.initial_params))
    for entry in trajectory.rounds:
        store.write_round(entry)
    return store


def continue_training(
    store: HistoryStore, session: UnlearnSession, forgotten: frozenset[int], rounds: int
) -> None:
    """Train ``rounds`` more rounds from the store's last model without ``forgotten``, recorded."""
    last = store.last_round()
    assert last is not None
    federation = session.federation
    training = session.run_view.config.training
    run_rounds(
        federation,
        session._aggregator,
        store.read_model(last),
        num_rounds=last + rounds,
        start_round=last + 1,
        client_ids=[c for c in federation.client_ids if c not in forgotten],
        participation=training.participation,
        observers=[HistoryRecorder(store, RecordAll())],
    )


def context_on(
    store: HistoryStore, session: UnlearnSession, request: UnlearnRequest, *, evaluate: bool = False
) -> UnlearnContext:
    """Return a metered context over ``store`` for ``request`` (its round count: the store's)."""
    run = session.run_view
    last = store.last_round()
    assert last is not None
    meter = CostMeter()
    training = run.config.training
    history: HistoryConfig = run.config.history
    return UnlearnContext(
        history=MeteredHistory(store, meter),
        clients=RemainingClients(session.federation, request.forget, meter),
        aggregator=session._aggregator,
        num_rounds=last,
        initial_params=store.read_model(0),
        final_model=store.read_model(last),
        meter=meter,
        evaluate=session.evaluation.evaluate if evaluate else None,
        training=TrainingInfo(training.participation, training.aggregator.name),
        recording=history,
        privacy=run.config.privacy,
        reference_provider=session.evaluation.reference_set,
    )
