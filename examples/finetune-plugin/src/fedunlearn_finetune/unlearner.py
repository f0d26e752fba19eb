"""The ``finetune`` method: params, details and the algorithm (see the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field

from fedunlearn.fl.engine import run_rounds
from fedunlearn.fl.records import RoundRecord
from fedunlearn.unlearn import Details, MethodParams, RunOutput, Unlearner, UnlearnRequest
from fedunlearn.unlearn.context import UnlearnContext


class FineTuneParams(MethodParams):
    """Hyperparameters: validated at construction (frozen, unknown keys rejected)."""

    rounds: int = Field(2, ge=1, le=10_000, description="k: FedAvg rounds from the final model")


@dataclass(frozen=True)
class FineTuneDetails(Details):
    """What ``finetune`` did.

    Attributes:
        rounds: The fine-tuning rounds run.
        start_round: The original run's round whose model it started from (T).
    """

    rounds: int
    start_round: int


class FineTune(Unlearner[FineTuneParams]):
    """FedAvg from the final model M_T with the remaining clients only, for k rounds."""

    params_type = FineTuneParams
    required_policies = None  # needs no client history: only the final model

    def history_bytes_needed(self, context: UnlearnContext) -> int:
        """Only the final model must be kept."""
        return context.final_params.numel() * 4

    def _run(self, request: UnlearnRequest, context: UnlearnContext) -> RunOutput:
        rows: list[dict[str, float]] = []

        class _Log:
            def on_round_end(self, record: RoundRecord) -> None:
                rows.append(context.record_round(record))

        k = self.params.rounds
        params = run_rounds(
            context.clients,
            context.aggregator,
            context.start_from(context.num_rounds),
            num_rounds=k,
            participation=context.training.participation,
            evaluate=context.evaluate,
            observers=[_Log()],
        )
        return RunOutput(params, rows, FineTuneDetails(rounds=k, start_round=context.num_rounds))
