"""Retrain from scratch: FedAvg from the same M_0 with the remaining clients only.

The reference every method is judged against (the "exact unlearning" upper bound): same T, E, lr,
batch size and aggregation rule as the original run, and the original per-(round, client) seeds,
so the remaining clients follow the batch orders they would have used. Under partial
participation each round's participants are the original run's participants of that round minus
the forgotten clients (as the replay methods use them), read from the history's client records;
a round whose participants were all forgotten leaves the model unchanged. Needs no client
update (only M_0 and the client records every policy keeps).

Trajectory: the result carries the rounds Retrain ran (``UnlearnResult.trajectory``), every
update a real one computed by a remaining client; a round with no remaining participant is a
round with a zero aggregate, so the new history has the run's T rounds (docs/lifecycle.md).

Deviation: [REC] resampling a fraction of the *remaining* clients (the earlier behaviour) gave a
different set, and a different number, of participants each round than the run had, so Retrain
differed from the original even when the forgotten client never took part.
"""

from __future__ import annotations

import torch

from fedunlearn.fl.engine import run_round
from fedunlearn.unlearn.base import MethodParams, RunOutput, Unlearner, UnlearnRequest
from fedunlearn.unlearn.context import UnlearnContext
from fedunlearn.unlearn.registry import register
from fedunlearn.unlearn.trajectory_log import TrajectoryLog


@register("retrain")
class Retrain(Unlearner):
    """Federated retraining from M_0 without the forgotten clients."""

    reads_round_models = False  # M_0 (or the last model) and updates only
    reads_stored_rounds = False  # M_0 and the client records: serves any generation

    serves_generations = True  # an applied trajectory (docs/lifecycle.md)
    params_type = MethodParams

    def history_bytes_needed(self, context: UnlearnContext) -> int:
        """Only M_0 must be kept."""
        return context.initial_params.numel() * 4

    def _run(self, request: UnlearnRequest, context: UnlearnContext) -> RunOutput:
        params = context.start_from(0)
        rows: list[dict[str, float]] = []
        log = TrajectoryLog(context)
        for round_ in range(1, context.num_rounds + 1):
            participants = context.original_participants(round_)
            if not participants:  # only forgotten clients took part: nothing to redo
                rows.append(context.end_round(round_, params))
                log.add(params, torch.zeros_like(params), [], scalars=rows[-1])
                continue
            record = run_round(
                context.clients,
                context.aggregator,
                params,
                round_,
                participants,
                evaluate=context.evaluate,
            )
            rows.append(context.record_round(record))
            log.add_record(record)
            params = record.global_after
        return RunOutput(params, rows, trajectory=log.trajectory(request.forget))
