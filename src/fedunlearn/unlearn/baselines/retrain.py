"""Retrain from scratch: FedAvg from the same M_0 with the remaining clients only.

The reference every method is judged against (the "exact unlearning" upper bound): same T, E, lr,
batch size, aggregation rule and participation fraction as the original run, and the original
per-(round, client) seeds, so the remaining clients follow the batch orders they would have used.
Needs no client history (only M_0).
"""

from __future__ import annotations

from fedunlearn.fl.engine import run_rounds
from fedunlearn.fl.records import RoundRecord
from fedunlearn.unlearn.base import MethodParams, RunOutput, Unlearner, UnlearnRequest
from fedunlearn.unlearn.context import UnlearnContext
from fedunlearn.unlearn.registry import register


class _RoundLog:
    def __init__(self, context: UnlearnContext) -> None:
        self.context = context
        self.rows: list[dict[str, float]] = []

    def on_round_end(self, record: RoundRecord) -> None:
        self.context.meter.rounds += 1
        self.rows.append({"round": record.round, **record.metrics})


@register("retrain")
class Retrain(Unlearner):
    """Federated retraining from M_0 without the forgotten clients."""

    params_type = MethodParams

    def history_bytes_needed(self, context: UnlearnContext) -> int:
        """Only M_0 must be kept."""
        return context.initial_params.numel() * 4

    def _run(
        self, request: UnlearnRequest, context: UnlearnContext
    ) -> RunOutput:
        log = _RoundLog(context)
        params = run_rounds(
            context.clients,
            context.aggregator,
            context.history.read_model(0),
            num_rounds=context.num_rounds,
            participation=context.training.participation,
            evaluate=context.evaluate,
            observers=[log],
        )
        return RunOutput(params, log.rows)
