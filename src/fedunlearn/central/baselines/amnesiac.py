"""Amnesiac Unlearning: subtract the stored updates of every batch that held a forgotten sample.

Steps: find ``SB = {l : B_l cap D_U != {}}``; ``theta' = theta_T - sum_{l in SB} (w_l - w_{l-1})``
summed in float64; optionally repair by ``repair_passes`` of plain SGD on ``D_R``.

Paper: Graves, Nagisetty, Ganesh, "Amnesiac Machine Learning", AAAI 2021, arXiv:2010.10981, the
amnesiac unlearning method (``theta_M' = theta_M - sum_{sb in SB} Delta theta_sb``, with "a small
amount of fine-tuning" when SB is large).
Deviations (docs/methods/central_baselines.md):
    AM1 The per-batch updates are the recorded iterate differences, every batch kept since
    ``D_U`` is unknown at training time; stored bytes count T parameter vectors plus the batch
    lists.
    AM2 No repair by default (the pure method, as the Mini-Unlearning paper runs it).
    AM3 The whole parameter vector is reverted (no BatchNorm statistics in these models).
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field

from fedunlearn.central.base import CentralUnlearner, Outcome
from fedunlearn.central.objectives import Objective
from fedunlearn.central.registry import register
from fedunlearn.central.trainer import TrainingRecord, forget_mask, train_sgd
from fedunlearn.errors import UnsupportedHistoryError

__all__ = ["Amnesiac", "AmnesiacParams"]


class AmnesiacParams(BaseModel):
    """Hyper-parameters of Amnesiac Unlearning.

    Attributes:
        repair_passes: Passes of SGD on ``D_R`` after the subtraction (0 = pure method).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    repair_passes: int = Field(0, ge=0)


@register("amnesiac")
class Amnesiac(CentralUnlearner):
    """Amnesiac Unlearning (Graves et al.)."""

    params_type = AmnesiacParams

    def check(self, record: TrainingRecord) -> None:
        """Raise unless every update (iterate) of the run was kept."""
        if record.first_iterate != 0:
            raise UnsupportedHistoryError(
                "amnesiac needs every batch update; this record keeps iterates from "
                f"w_{record.first_iterate}. Retrain with keep_last=None."
            )

    def _unlearn(
        self, objective: Objective, record: TrainingRecord, forget: torch.Tensor
    ) -> Outcome:
        mask = forget_mask(objective.num_samples, forget)
        touched = mask[record.batches].any(dim=1)  # SB
        steps = torch.nonzero(touched).flatten() + 1
        updates = record.iterates[steps] - record.iterates[steps - 1]
        params = record.final - updates.sum(dim=0)
        evals = 0
        if self.params.repair_passes:
            spec = record.spec.model_copy(update={"passes": self.params.repair_passes})
            pool = torch.nonzero(~mask).flatten()
            params = train_sgd(objective, spec, w0=params, pool=pool, keep_last=0).final
            evals = self.params.repair_passes * (len(pool) // spec.batch_size) * spec.batch_size
        stored = record.iterate_bytes(record.num_steps) + record.batch_bytes(record.num_steps)
        details = {"batches_reverted": int(touched.sum()), "batches_total": record.num_steps}
        return Outcome(params, stored, evals, details)
