"""Hessian-vector oracles ``H(l) v = v - eta/(B - dB) Hbar(l) v`` behind one interface.

``Hbar(l) = sum_{j in R_l} hess F_j(w_{l-1})`` is the *sum* over the retained samples of batch l
(Eq. 8). Three oracles:

- ``ExactOracle``: the objective's own HVP (closed form for the linear objectives, double
  backprop for ``AutogradObjective``); the default.
- ``LBFGSOracle``: compact BFGS (``linalg.lbfgs.CompactBFGS``) from m secant pairs of stored
  iterates ``w_{l-1-m}..w_{l-1}``. ``secants="same_sample"`` evaluates both ends of every pair
  on ``R_l``; ``"cross_batch"`` is the paper's literal window (each point with its own batch).
  Unusable pairs (guards a-c) are dropped; with none left the exact HVP is used and counted.
- ``ExplicitOracle``: the p x p matrix ``H(l)`` rebuilt from the action of another oracle on the
  standard basis (paper §4.2), cached per step.

Every oracle also has ``matrix(view)``, the explicit H(l), used by the parallel Algorithm 3
(engine ``explicit``, indices fixed: MU3).

Paper: Huang et al., "Machine Unlearning with Minimal Gradient Dependence for High Unlearning
Ratios", Eq. 8, §4.2 (basis matrices, Eq. 11), Appendix B / Algorithm 4 (L-BFGS, m = 2).
Deviations (docs/methods/mini_unlearning.md):
    MU5 [FIX] Algorithm 4's sigma, ``L D L^T`` and block signs are wrong; the compact form of
    Byrd et al. (shared ``linalg.lbfgs``) is used.
    MU6 same-sample secants with a curvature guard and exact fallback; the paper's cross-batch
    pairs stay available for verification MUV5.
    MU10 the exact HVP is the default.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Literal

import torch

from fedunlearn.central.objectives import Objective
from fedunlearn.central.recursion import StepView
from fedunlearn.central.trainer import TrainingRecord
from fedunlearn.linalg.lbfgs import CompactBFGS, GuardCounts, NoCurvaturePairsError, pair_problem

__all__ = ["ExactOracle", "ExplicitOracle", "HessianOracle", "LBFGSOracle"]


class HessianOracle(ABC):
    """``H(l) v`` for a step of the recorded run.

    Attributes:
        products: Number of ``Hbar v`` products computed (exact or approximate).
    """

    def __init__(self) -> None:
        self.products = 0

    def apply(self, view: StepView, v: torch.Tensor) -> torch.Tensor:
        """Return ``H(l) v`` (Eq. 8); ``v`` itself when the whole batch is forgotten."""
        if len(view.retained) == 0 or not bool(v.any()):
            return v.clone()
        self.products += 1
        return v - (view.lr / len(view.retained)) * self.curvature(view, v)

    @abstractmethod
    def curvature(self, view: StepView, v: torch.Tensor) -> torch.Tensor:
        """Return ``Hbar(l) v`` (sum over the retained samples of the batch)."""

    def matrix(self, view: StepView) -> torch.Tensor:
        """Return ``H(l)`` as a p x p matrix: ``sum_q (H(l) e_q) e_q^T`` (standard basis)."""
        dim = len(view.w_prev)
        eye = torch.eye(dim, dtype=torch.float64)
        return torch.stack([self.apply(view, eye[q]) for q in range(dim)], dim=1)


class ExactOracle(HessianOracle):
    """Exact ``Hbar v`` from the objective (closed form or double backprop)."""

    def __init__(self, objective: Objective) -> None:
        super().__init__()
        self.objective = objective

    def curvature(self, view: StepView, v: torch.Tensor) -> torch.Tensor:
        """Return ``sum_{R_l} hess F_j(w_{l-1}) v``."""
        return self.objective.hvp_sum(view.w_prev, view.retained, v)


class LBFGSOracle(HessianOracle):
    """Compact-BFGS ``Hbar v`` from m secant pairs of stored iterates (Deviations MU5, MU6).

    Args:
        objective: Per-sample objective (gradients for the secants, exact fallback).
        record: The training record; needs ``w_{l-1-m}..w_{l-1}`` for every step used.
        mask: Boolean ``D_U`` mask (for the cross-batch variant's retained sets).
        history: m (paper: 2).
        secants: ``"same_sample"`` (recommended) or ``"cross_batch"`` (paper-literal).

    Attributes:
        counts: Guard firings (shared ``GuardCounts``).
        fallbacks: Steps that used the exact HVP because no pair was usable.
    """

    def __init__(
        self,
        objective: Objective,
        record: TrainingRecord,
        mask: torch.Tensor,
        history: int = 2,
        secants: Literal["same_sample", "cross_batch"] = "same_sample",
    ) -> None:
        super().__init__()
        self.objective = objective
        self.record = record
        self.mask = mask
        self.history = history
        self.secants = secants
        self.counts = GuardCounts()
        self.fallbacks = 0
        self._cache: dict[int, CompactBFGS | None] = {}

    def _retained(self, step: int) -> torch.Tensor:
        batch = self.record.batch(step)
        return batch[~self.mask[batch]]

    def _build(self, view: StepView) -> CompactBFGS | None:
        first = max(0, view.step - 1 - self.history)
        points = [self.record.iterate(i) for i in range(first, view.step)]  # z_0..z_m
        if self.secants == "same_sample":
            grads = [self.objective.grad_sum(z, view.retained) for z in points]
        else:  # paper: z_i with the retained samples of the batch applied at z_i
            grads = [
                self.objective.grad_sum(z, self._retained(i + 1))
                for i, z in zip(range(first, view.step), points, strict=True)
            ]
        pairs = []
        for a in range(len(points) - 1):
            s, y = points[a + 1] - points[a], grads[a + 1] - grads[a]
            problem = pair_problem(s, y, float(points[a + 1].norm()))
            if problem is None:
                pairs.append((s, y))
            else:
                setattr(self.counts, problem, getattr(self.counts, problem) + 1)
        try:
            return CompactBFGS(pairs, self.counts)
        except NoCurvaturePairsError:
            self.counts.no_pairs += 1
            return None

    def curvature(self, view: StepView, v: torch.Tensor) -> torch.Tensor:
        """Return ``B v`` (compact BFGS), or the exact product if no pair is usable."""
        if view.step not in self._cache:
            self._cache[view.step] = self._build(view)
        bfgs = self._cache[view.step]
        if bfgs is None:
            self.fallbacks += 1
            return self.objective.hvp_sum(view.w_prev, view.retained, v)
        return bfgs.matvec(v)


class ExplicitOracle(HessianOracle):
    """``H(l) v`` from an explicit matrix built once per step from a base oracle (paper §4.2).

    Args:
        base: The oracle whose action on the standard basis defines ``H(l)``.
    """

    def __init__(self, base: HessianOracle) -> None:
        super().__init__()
        self.base = base
        self._mats: dict[int, torch.Tensor] = {}

    def apply(self, view: StepView, v: torch.Tensor) -> torch.Tensor:
        """Return ``H(l) v`` from the cached explicit matrix."""
        if view.step not in self._mats:
            self._mats[view.step] = self.base.matrix(view)
        self.products += 1
        return self._mats[view.step] @ v

    def curvature(self, view: StepView, v: torch.Tensor) -> torch.Tensor:
        """Return ``Hbar v`` recovered from the explicit ``H(l)``."""
        return (v - self.apply(view, v)) * (len(view.retained) / view.lr)

    def matrix(self, view: StepView) -> torch.Tensor:
        """Return the base oracle's explicit ``H(l)``."""
        return self.base.matrix(view)
