"""DeltaGrad: replay the run without ``D_U`` using cached gradients plus L-BFGS corrections.

Steps of one pass over the recorded steps l = 1..T (``t = l - 1``, 0-based as in the authors'
code): skip an emptied batch; on *exact* iterations (``t < j0`` or ``(t - j0) mod T0 == 0``)
compute the retained gradient at the new iterate ``w^I_t``, push the secant pair
``(w^I_t - w_t, (g_full(w^I_t) - g_t) / B)`` on the same sample set ``B_t``, and take the exact
leave-out step; on *approximate* iterations estimate the batch gradient at ``w^I_t`` as
``g_t + B * Bmat (w^I_t - w_t)`` (compact L-BFGS, m pairs), subtract the exact forgotten-sample
gradients and step with ``eta / (B - dB)``. The comments cite the lines of Listing DG in
docs/methods/central_baselines.md.

Paper: Wu, Dobriban, Davidson, "DeltaGrad: Rapid retraining of machine learning models",
ICML 2020, arXiv:2006.14755 (deletions, SGD form). The paper text was not available: the
algorithm is restated from the authors' code (``model_update_deltagrad``) and README.
Deviations (docs/methods/central_baselines.md):
    DG2 Cached batch gradients are the *regularised* sums ``sum_{B_t} grad F_j(w_t)`` (the
    objective carries lam), one consistent convention for the secants and the estimate.
    DG3 The forgotten-sample term uses ``lam w^I_t`` (the exact leave-out formula; the code
    uses ``lam w_t``).
    DG4 An approximate step with no usable pair falls back to an exact one (counted).
    DG5 Defaults m = 2, T0 = 5, j0 = 20 (README); the Mini-Unlearning paper's j0 = 10 is a
    parameter.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field

from fedunlearn.central.base import CentralUnlearner, Outcome
from fedunlearn.central.objectives import Objective
from fedunlearn.central.registry import register
from fedunlearn.central.trainer import TrainingRecord, forget_mask
from fedunlearn.errors import UnsupportedHistoryError
from fedunlearn.linalg.lbfgs import NoCurvaturePairsError, SecantBuffer

__all__ = ["DeltaGrad", "DeltaGradParams"]


class DeltaGradParams(BaseModel):
    """Hyper-parameters of DeltaGrad.

    Attributes:
        period: T0, exact iteration every T0 steps after the burn-in.
        burn_in: j0, exact iterations at the start.
        history: m, secant pairs kept.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    period: int = Field(5, ge=1)
    burn_in: int = Field(20, ge=0)
    history: int = Field(2, ge=1)


@register("deltagrad")
class DeltaGrad(CentralUnlearner):
    """DeltaGrad for deletions (SGD form)."""

    params_type = DeltaGradParams

    def check(self, record: TrainingRecord) -> None:
        """Raise unless the full trajectory and every batch gradient were cached."""
        if record.first_iterate != 0 or record.batch_grads is None:
            raise UnsupportedHistoryError(
                "deltagrad needs every iterate and batch gradient; train with keep_last=None "
                "and cache_batch_grads=True"
            )

    def _unlearn(
        self, objective: Objective, record: TrainingRecord, forget: torch.Tensor
    ) -> Outcome:
        p = self.params
        assert record.batch_grads is not None  # checked in check()
        mask = forget_mask(objective.num_samples, forget)
        buffer = SecantBuffer(p.history)
        w_new = record.iterate(0).clone()
        exact_steps = fallbacks = evals = 0
        for step in range(1, record.num_steps + 1):
            t = step - 1
            batch = record.batch(step)
            gone = mask[batch]
            kept, removed = batch[~gone], batch[gone]
            if len(kept) == 0:  # an emptied batch is skipped (line 4)
                continue
            w_old, g_old = record.iterate(t), record.batch_grads[t]
            exact = t < p.burn_in or (t - p.burn_in) % p.period == 0
            approx = None
            if not exact:
                try:
                    approx = buffer.hvp(w_new - w_old)
                except NoCurvaturePairsError:  # DG4: run this step exactly
                    fallbacks += 1
            if approx is None:  # exact iteration (Listing DG lines 5-12)
                exact_steps += 1
                g_kept = objective.grad_sum(w_new, kept)
                g_full = g_kept + objective.grad_sum(w_new, removed)
                buffer.push(w_new - w_old, (g_full - g_old) / len(batch), float(w_new.norm()))
                w_new = w_new - (record.spec.lr / len(kept)) * g_kept
                evals += len(batch)
            else:  # approximate iteration (Listing DG lines 13-18)
                g_batch = g_old + len(batch) * approx
                g_removed = objective.grad_sum(w_new, removed)
                w_new = w_new - (record.spec.lr / len(kept)) * (g_batch - g_removed)
                evals += len(removed)
        stored = 2 * record.iterate_bytes(record.num_steps) + record.batch_bytes(record.num_steps)
        details = {
            "exact_steps": exact_steps,
            "fallbacks": fallbacks,
            "guards": buffer.counts.to_dict(),
        }
        return Outcome(w_new, stored, evals, details)
