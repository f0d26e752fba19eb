"""Final tuning after a replay: FedAvg rounds of the remaining clients within an epoch budget.

A replay method (Crab, FedADP) may follow its replay with ordinary FL rounds of the remaining
clients (the run's participation and aggregation rule, fresh round numbers T+1..T+F, so fresh
seeds). ``final_round_count`` is the one rule that sizes them: ``final_rounds`` as given, or for
``"auto"`` as many rounds as the replay skipped after its start, at most as many as keep the
method's client epochs (replay plus tuning) within ``epoch_budget`` times Retrain's (every
round's original participants minus the forgotten clients, at the run's E). ``final_tuning``
runs them and returns the model and their round rows.

Crab's design note tag: docs/methods/crab.md, CB13; FedADP's: docs/methods/fedadp.md, AD23.
Neither paper tunes after the replay; ``final_rounds: 0`` is each paper's recovery.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch

from fedunlearn.fl.engine import run_rounds, sample_clients
from fedunlearn.fl.records import RoundRecord
from fedunlearn.unlearn.context import UnlearnContext
from fedunlearn.unlearn.trajectory_log import TrajectoryLog

__all__ = ["final_round_count", "final_tuning"]


def final_round_count(
    context: UnlearnContext,
    final_rounds: int | Literal["auto"],
    epoch_budget: float,
    *,
    start_round: int,
    replay_sizes: Sequence[int],
    replay_epochs: int | None = None,
) -> int:
    """Return the final tuning rounds: ``final_rounds``, or ``auto``'s count.

    ``auto``: the FL rounds after ``start_round`` the replay did not cover (unstored rounds and
    replayed rounds without a client), at most as many as keep the client epochs within
    ``epoch_budget`` x Retrain's.

    Args:
        context: The unlearning context.
        final_rounds: A count, or ``"auto"``.
        epoch_budget: Share of Retrain's client epochs the replay and tuning may spend.
        start_round: The FL round the replay starts after (Crab: t_{j*}; FedADP: 0).
        replay_sizes: Participants of each replayed round.
        replay_epochs: Local epochs of the replay's fresh updates (default: the run's E).
    """
    if final_rounds != "auto":
        return int(final_rounds)
    total = context.num_rounds
    epochs = context.clients.spec.epochs
    replay_epochs = epochs if replay_epochs is None else replay_epochs
    # Retrain's client epochs: every round's original participants minus the forgotten
    retrain_sizes = [len(context.original_participants(t)) for t in range(1, total + 1)]
    per_round = len(  # the clients of one final tuning round
        sample_clients(
            context.clients.client_ids, context.training.participation, context.clients.seed, 1
        )
    )
    replayed = sum(1 for n in replay_sizes if n)
    gap = total - start_round - replayed
    # in units of E-epoch client runs (exactly Crab's arithmetic when replay_epochs == E)
    replay_runs = sum(replay_sizes) * (replay_epochs / epochs)
    spare = (epoch_budget * sum(retrain_sizes) - replay_runs) * epochs
    within = math.floor(spare / (per_round * epochs) + 1e-9)
    return max(0, min(gap, within))


class _RoundLog:
    """Counts and records the final tuning rounds (and adds them to a trajectory, if any)."""

    def __init__(self, context: UnlearnContext, trajectory: TrajectoryLog | None) -> None:
        self.context = context
        self.rows: list[dict[str, float]] = []
        self.trajectory = trajectory

    def on_round_end(self, record: RoundRecord) -> None:
        self.rows.append(self.context.record_round(record))
        if self.trajectory is not None:
            self.trajectory.add_record(record)


def final_tuning(
    context: UnlearnContext,
    params: torch.Tensor,
    rounds: int,
    trajectory: TrajectoryLog | None = None,
) -> tuple[torch.Tensor, list[dict[str, float]]]:
    """Run ``rounds`` FL rounds T+1..T+rounds of the remaining clients from ``params``.

    Fresh round numbers give fresh client seeds; the run's participation and aggregation rule.
    With ``trajectory`` the rounds are added to it as extra rounds (fresh, not estimated).

    Returns:
        The model after the last round and one metrics row per round (``params`` and no rows
        when ``rounds`` is 0).
    """
    if rounds <= 0:
        return params, []
    tuning = _RoundLog(context, trajectory)
    params = run_rounds(
        context.clients,
        context.aggregator,
        params,
        num_rounds=context.num_rounds + rounds,
        start_round=context.num_rounds + 1,
        participation=context.training.participation,
        evaluate=context.evaluate,
        observers=[tuning],
    )
    return params, tuning.rows
