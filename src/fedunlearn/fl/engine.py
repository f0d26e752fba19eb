"""The federated training loop: sample, train, screen, aggregate, observe.

One round (``run_round``):
1. sample the participants among the clients present (a ``fl.sampling.ClientSampler``: a seeded
   fraction without replacement by default, full participation unless asked; TV-stable sampling
   draws a multiset with replacement; a client with a join round is absent before it);
2. ask them to train (``fl.clients.Clients.train``; in-process ``Federation.train``: executor,
   then update mods such as attacks);
3. screen the uploads: a delta with NaN/Inf or of the wrong shape is rejected, logged and kept
   out of the aggregate (and recorded as rejected by the history recorder);
4. aggregate the accepted deltas (weighted by n_c, or by multiplicity under TV-stable
   sampling) and apply ``M_{t+1} = M_t + aggregate``;
5. evaluate and hand a frozen ``RoundRecord`` to every observer (history recording, metrics,
   progress bars, later methods).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import torch

from fedunlearn.errors import ConfigError
from fedunlearn.fl.aggregators import Aggregator
from fedunlearn.fl.clients import Clients, RunClients, TrainTask
from fedunlearn.fl.records import ClientUpdate, RejectedUpdate, RoundRecord
from fedunlearn.fl.sampling import ClientDraw, ClientSampler, FractionSampler

log = logging.getLogger(__name__)

Evaluator = Callable[[torch.Tensor], dict[str, float]]


class RoundObserver(Protocol):
    """Something told about every finished round."""

    def on_round_end(self, record: RoundRecord) -> None:
        """Observe one round."""
        ...


def sample_clients(client_ids: Sequence[int], fraction: float, seed: int, round_: int) -> list[int]:
    """Return the sorted participants of a round: all clients, or a seeded fraction (at least 1)."""
    return list(FractionSampler(fraction, seed).draw(round_, client_ids).ids)


def screen_update(update: ClientUpdate, num_params: int) -> str | None:
    """Return why an upload must be rejected, or None if it is usable."""
    delta = update.delta
    if not isinstance(delta, torch.Tensor) or delta.ndim != 1 or delta.numel() != num_params:
        shape = tuple(delta.shape) if isinstance(delta, torch.Tensor) else type(delta).__name__
        return f"wrong shape {shape}; expected ({num_params},)"
    if not delta.is_floating_point():
        return f"wrong dtype {delta.dtype}; expected a floating point vector"
    if not bool(torch.isfinite(delta).all()):
        bad = int((~torch.isfinite(delta)).sum())
        return f"{bad} non-finite (NaN/Inf) coordinate(s)"
    return None


def run_round(
    federation: Clients,
    aggregator: Aggregator,
    global_params: torch.Tensor,
    round_: int,
    participants: Sequence[int] | ClientDraw,
    *,
    evaluate: Evaluator | None = None,
) -> RoundRecord:
    """Run one FL round from ``global_params`` with ``participants`` and return its record.

    ``participants``: client ids (each once, FedAvg weights n_c), or a ``ClientDraw`` (its
    multiplicities, and its weights when it is not size-weighted).
    """
    draw = participants if isinstance(participants, ClientDraw) else None
    ids = draw.ids if draw is not None else participants
    by_weight = draw.weights() if draw is not None else None
    uploads = federation.train(TrainTask(global_params, ids, round_))
    accepted: list[ClientUpdate] = []
    rejected: list[RejectedUpdate] = []
    for update in uploads:
        reason = screen_update(update, federation.num_params)
        if reason is None:
            accepted.append(update)
        else:
            log.warning("round %d: rejected client %d: %s", round_, update.client_id, reason)
            rejected.append(RejectedUpdate(update.client_id, reason, update.num_samples))
    if accepted:
        deltas = torch.stack([u.delta.to(torch.float32) for u in accepted])
        weights = torch.tensor(
            [
                float(u.num_samples if by_weight is None else by_weight[u.client_id])
                for u in accepted
            ]
        )
        aggregate = aggregator(deltas, weights)
    else:
        log.warning("round %d: no usable update; the global model is unchanged", round_)
        aggregate = torch.zeros_like(global_params)
    new_params = global_params + aggregate
    metrics: dict[str, float] = {}
    if accepted:
        total = sum(u.num_samples for u in accepted)
        metrics["train_loss"] = sum(u.train_loss * u.num_samples for u in accepted) / total
    if evaluate is not None:
        metrics.update(evaluate(new_params))
    return RoundRecord(
        round=round_,
        global_before=global_params,
        global_after=new_params,
        aggregate=aggregate,
        updates=tuple(accepted),
        rejected=tuple(rejected),
        metrics=metrics,
        multiplicity=dict(draw.multiplicity) if draw is not None and not draw.size_weighted else {},
    )


def run_rounds(
    federation: RunClients,
    aggregator: Aggregator,
    initial_params: torch.Tensor,
    *,
    num_rounds: int,
    start_round: int = 1,
    client_ids: Sequence[int] | None = None,
    participation: float = 1.0,
    evaluate: Evaluator | None = None,
    observers: Sequence[RoundObserver] = (),
    join_rounds: Mapping[int, int] | None = None,
    sampler: ClientSampler | None = None,
) -> torch.Tensor:
    """Run rounds ``start_round..num_rounds`` and return the final flat global model.

    Args:
        federation: The clients.
        aggregator: Aggregation rule.
        initial_params: The global model before ``start_round`` (M_0 for a fresh run).
        num_rounds: Last round to run (T).
        start_round: First round to run (> 1 when resuming).
        client_ids: Clients that take part (default: all; Retrain passes the remaining ones).
        participation: Fraction of ``client_ids`` sampled each round.
        evaluate: Called on each new global model; its dict joins the round's metrics.
        observers: Told about each finished round, in order.
        join_rounds: Client -> the first round it may be sampled in (clients that join the
            federation late); others are present from round 1.
        sampler: Draws each round's participants among the clients present (default: a
            ``FractionSampler`` of ``participation`` with the federation's seed).
    """
    ids = list(federation.client_ids if client_ids is None else client_ids)
    if not ids:
        raise ConfigError("no clients to train with; at least one client must remain")
    joins = dict(join_rounds or {})
    draws = sampler if sampler is not None else FractionSampler(participation, federation.seed)
    params = initial_params
    for round_ in range(start_round, num_rounds + 1):
        present = [c for c in ids if joins.get(c, 1) <= round_] if joins else ids
        draw = draws.draw(round_, present)
        participants = draw if not draw.size_weighted else list(draw.ids)
        record = run_round(federation, aggregator, params, round_, participants, evaluate=evaluate)
        for observer in observers:
            observer.on_round_end(record)
        params = record.global_after
    return params
