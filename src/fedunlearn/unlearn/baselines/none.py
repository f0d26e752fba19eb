"""No unlearning: the original final model, the control row of every comparison.

Design notes: docs/methods/baselines.md (no parameters, no deviations).
"""

from __future__ import annotations

from fedunlearn.unlearn.base import MethodParams, RunOutput, Unlearner, UnlearnRequest
from fedunlearn.unlearn.context import UnlearnContext
from fedunlearn.unlearn.registry import register


@register("none")
class NoUnlearning(Unlearner[MethodParams]):
    """Return the run's final model as it is."""

    reads_round_models = False  # M_0 (or the last model) and updates only

    serves_generations = True  # an applied trajectory (docs/lifecycle.md)
    serves_shards = True  # returns the run's model, whatever it is
    params_type = MethodParams

    def history_bytes_needed(self, context: UnlearnContext) -> int:
        """Only the final model is kept."""
        return context.final_model.numel() * 4

    def _run(self, request: UnlearnRequest, context: UnlearnContext) -> RunOutput:
        return RunOutput(context.start_from(context.num_rounds))
