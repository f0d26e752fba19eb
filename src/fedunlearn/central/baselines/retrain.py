"""The reference rows: Original (no unlearning), replay retraining and fresh retraining.

Paper: Huang et al., "Machine Unlearning with Minimal Gradient Dependence for High Unlearning
Ratios", §5.1 "Traditional Retraining" (same initialisation and hyper-parameters), Eq. 2.
Deviations (docs/methods/central_baselines.md):
    RF1 The Original control row, which the paper omits.
    RF2 Replay retraining (same batches, forgotten samples dropped, Eq. 2) for distances and
    fresh retraining (new batches on D_R) for accuracy and MIA: the paper does not say which it
    ran.
"""

from __future__ import annotations

import torch

from fedunlearn.central.base import CentralUnlearner, Outcome
from fedunlearn.central.objectives import Objective
from fedunlearn.central.registry import register
from fedunlearn.central.trainer import TrainingRecord, fresh_retrain, replay_retrain

__all__ = ["FreshRetrain", "Original", "ReplayRetrain"]


@register("original")
class Original(CentralUnlearner):
    """No unlearning: ``w_T`` itself (the control row)."""

    def _unlearn(
        self, objective: Objective, record: TrainingRecord, forget: torch.Tensor
    ) -> Outcome:
        return Outcome(record.final.clone(), 0, 0, {})


@register("replay")
class ReplayRetrain(CentralUnlearner):
    """Replay retraining: the recorded batches minus ``D_U`` from ``w_0`` (Eq. 2)."""

    def _unlearn(
        self, objective: Objective, record: TrainingRecord, forget: torch.Tensor
    ) -> Outcome:
        params, _ = replay_retrain(objective, record, forget)
        evals = record.num_steps * record.spec.batch_size
        return Outcome(params, record.batch_bytes(record.num_steps), evals, {})


@register("retrain")
class FreshRetrain(CentralUnlearner):
    """Fresh retraining on ``D_R`` with new batches and the same hyper-parameters."""

    def _unlearn(
        self, objective: Objective, record: TrainingRecord, forget: torch.Tensor
    ) -> Outcome:
        fresh = fresh_retrain(objective, record.spec, forget)
        evals = fresh.num_steps * record.spec.batch_size
        return Outcome(fresh.final, 0, evals, {})
