"""No unlearning: the original final model, the control row of every comparison."""

from __future__ import annotations

from typing import Any

import torch

from fedunlearn.unlearn.base import MethodParams, UnlearnContext, Unlearner, UnlearnRequest
from fedunlearn.unlearn.registry import register


@register("none")
class NoUnlearning(Unlearner):
    """Return the run's final model as it is."""

    params_type = MethodParams

    def history_bytes_needed(self, context: UnlearnContext) -> int:
        """Only the final model is kept."""
        return context.final_params.numel() * 4

    def _run(
        self, request: UnlearnRequest, context: UnlearnContext
    ) -> tuple[torch.Tensor, list[dict[str, float]], dict[str, Any]]:
        return context.history.read_model(context.num_rounds), [], {}
