"""Exact replay: train the run again on the reduced data from the first round that can differ.

Shared by Retrain (from round 1) and the deletion-ready methods (``tv_exact``, ``shard_retrain``:
from the first round that drew a forgotten client or used a deleted sample). Round t of the replay
asks the remaining clients of ``context.draw(t)`` to train from the replayed model, with the run's
own seeds for round t, and aggregates them with the run's rule; the rounds before the start are the
run's own, kept as they are (``TrajectoryLog.keep``: by reference, nothing is read), and the replay
starts from their last stored global model. Why that is exact: before the start round no draw and no
mini-batch involved the deleted data, and every draw is a pure function of (seed, round, ids) with
deletion-consistent samplers (``fl.sampling``), so training on the reduced data from scratch would
have produced those rounds bit for bit; from the start round on the replay *is* that training
(docs/deletion_ready.md, "What exact means"). For a run trained with the default sampler (the
original participants minus the forgotten, weighted by n_c), starting at the first round a forgotten
client was drawn reproduces Retrain bit for bit as well.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from fedunlearn.fl.clients import RunClients
from fedunlearn.fl.engine import run_round, run_sharded_round
from fedunlearn.fl.sampling import ClientDraw
from fedunlearn.unlearn.base import RunOutput, UnlearnRequest
from fedunlearn.unlearn.context import UnlearnContext
from fedunlearn.unlearn.trajectory_log import TrajectoryLog

__all__ = ["policy_keeps", "replay_from", "replay_shards"]


def policy_keeps(context: UnlearnContext) -> Callable[[int], bool] | None:
    """Return round -> whether the run's recording policy keeps its updates (None: every round).

    The built-in policies ``none`` (global models only) and ``every`` (every k-th round) keep
    fewer updates than a replay computes; a replayed history keeps what the run would have
    kept, so applying it does not store what the run chose not to (and its apply file stays
    small). Other policies keep every replayed update.
    """
    policy = context.recording.policy
    if policy == "none":
        return lambda round_: False
    if policy == "every":
        every = context.recording.every
        return lambda round_: (round_ - 1) % every == 0
    return None


def replay_from(
    context: UnlearnContext,
    request: UnlearnRequest,
    start_round: int,
    clients: RunClients | None = None,
) -> RunOutput:
    """Keep rounds ``1..start_round-1`` and retrain rounds ``start_round..T`` on the reduced data.

    Args:
        context: The method's context (its clients are the remaining ones, on the reduced data).
        request: The request (its forgotten clients never appear in the new history).
        start_round: The first round to retrain (1: Retrain); ``T + 1`` keeps every round.
        clients: Who trains instead of ``context.clients`` (DP Retrain's private clients).

    Returns:
        The model after round T, the replayed rounds' metrics, and the whole new history
        (kept rounds, then replayed ones) as its trajectory.
    """
    clients = context.clients if clients is None else clients
    log = TrajectoryLog(context, keeps_updates=policy_keeps(context))
    log.keep(start_round - 1)
    params = context.start_from(start_round - 1)
    rows: list[dict[str, float]] = []
    for round_ in range(start_round, context.num_rounds + 1):
        draw = context.draw(round_)
        if not draw.ids:  # only forgotten clients took part: nothing to redo
            rows.append(context.end_round(round_, params))
            log.add(params, torch.zeros_like(params), [], scalars=rows[-1])
            continue
        participants: Sequence[int] | ClientDraw = list(draw.ids) if draw.size_weighted else draw
        record = run_round(
            clients, context.aggregator, params, round_, participants, evaluate=context.evaluate
        )
        rows.append(context.record_round(record))
        log.add_record(record)
        params = record.global_after
    return RunOutput(params, rows, trajectory=log.trajectory(request.forget))


def replay_shards(
    context: UnlearnContext,
    request: UnlearnRequest,
    starts: Mapping[int, int | None],
    clients: RunClients | None = None,
) -> RunOutput:
    """Exact replay of a sharded run: retrain each shard from its own start round only.

    Shard ``s`` with ``starts[s]`` = r retrains rounds r..T on its remaining clients from its
    stored model after round r - 1; a shard whose start is None (it never held the deleted
    data) keeps its stored models. From the earliest start on, each round's model is the
    combination of the shard models (``fl.shards.combine``), and the new history's round keeps
    the run's own records and stored updates of the shards it did not retrain.

    Args:
        context: The method's context (a sharded run: ``context.training.shards``).
        request: The request.
        starts: Shard -> its first round to retrain (None: keep it).
        clients: Who trains instead of ``context.clients``.
    """
    plan = context.training.shards
    assert plan is not None
    clients = context.clients if clients is None else clients
    history = context.history
    total = context.num_rounds
    affected = {s: r for s, r in starts.items() if r is not None}
    first = min(affected.values(), default=total + 1)
    log = TrajectoryLog(context, keeps_updates=policy_keeps(context))
    log.keep(first - 1)
    params = context.start_from(first - 1)
    shards = {s: history.read_shard_model(first - 1, s) for s in plan.shards}
    rows: list[dict[str, float]] = []
    for round_ in range(first, total + 1):
        live = {s for s, r in affected.items() if round_ >= r}
        fixed = {s: history.read_shard_model(round_, s) for s in plan.shards if s not in live}
        draws = {s: context.draw(round_, shard=s) for s in live}
        record = run_sharded_round(
            clients,
            context.aggregator,
            shards,
            round_,
            draws,
            fixed=fixed,
            evaluate=context.evaluate,
        )
        kept = [
            r
            for r in history.client_records(round_)
            if plan.shard_of.get(r.client_id) not in live and r.client_id not in request.forget
        ]
        stored = {r.client_id: history.read_update(round_, r.client_id) for r in kept if r.stored}
        rows.append(context.record_round(record))
        log.add_record(record, carried=kept, carried_updates=stored)
        shards = dict(record.shard_models)
        params = record.global_after
    return RunOutput(params, rows, trajectory=log.trajectory(request.forget))
