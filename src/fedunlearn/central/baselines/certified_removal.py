"""Certified Data Removal (Guo et al.): loss-perturbed one-vs-rest linear models, Newton removal.

Steps: ``prepare`` scales features so ``||[x, 1]|| <= 1``, draws ``b ~ N(0, sigma^2 I)`` per
class and solves ``L_b(w) = sum_i log(1 + exp(-y_i w^T x_i)) + (lam n / 2) ||w||^2 + b^T w`` per
one-vs-rest class (L-BFGS to a tight tolerance); ``unlearn`` removes the whole forget set at
once: ``Delta = r lam w + sum_{i in U} grad l_i(w)``,
``H = sum_{i not in U} hess l_i(w) + lam (n - r) I``,
``w <- w + H^{-1} Delta`` (solved by conjugate gradients), and reports a bound on the gradient
residual ``||grad L'_b(w-)||`` of the kept data's objective against the budget ``sigma eps / c``:
the data-dependent Newton bound ``gamma ||X_R||_2 ||u|| ||X_R u||`` (Cor. 1) summed over classes,
plus what the solves left: the training solve's gradient ``||grad L_b(w*)||`` (Cor. 1 assumes
it is zero) and the conjugate-gradient residual ``||H u - Delta||``. Then
``grad L'_b(w-) = grad L_b(w*) + (H u - Delta) + R`` with ``||R||`` within the Newton bound, so
the reported bound holds whatever the tolerances.

Paper: Guo, Goldstein, Hannun, van der Maaten, "Certified Data Removal from Machine Learning
Models", ICML 2020, arXiv:1911.03030, Alg. 1-2, Eq. 3, Cor. 1, Thm. 3; run as the
Mini-Unlearning paper does (§5.1: lam = 0.005, sigma = 0.01).
Deviations (docs/methods/central_baselines.md):
    CR1 one-vs-rest binary models, each with its own b. CR2 one Newton step for the whole
    batch U. CR3 no budget-triggered retraining: ``bound``, ``budget`` and ``would_retrain``
    are reported instead.
    CR4 ``H^{-1} Delta`` by conjugate gradients with exact HVPs.
    CR5 the training solve (L-BFGS-B, ``max_iter``) may stop short of the minimiser; its
    gradient norm and the CG residual are added to Cor. 1's Newton term (the paper assumes
    exact solves; with a finite L-BFGS budget the residual can dominate).
    CR6 one global feature scale M with the bias as a constant feature; the OvR scores are
    mapped back to the unscaled ``nn.Linear`` layout (``W = w_x / M``, ``b = w_1 / M``).
    CR7-CR9 defaults, the summed bound (power-iteration ||X_R||_2), stored bytes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from scipy.optimize import minimize

from fedunlearn.central.base import CentralUnlearner, Outcome
from fedunlearn.central.objectives import Objective, SoftmaxRegression
from fedunlearn.central.registry import register
from fedunlearn.central.trainer import TrainingRecord, forget_mask
from fedunlearn.errors import ConfigError

__all__ = [
    "CertifiedRemoval",
    "CertifiedRemovalParams",
    "certificate_constant",
    "newton_removal",
    "newton_update",
    "removal_budget",
]


class CertifiedRemovalParams(BaseModel):
    """Hyper-parameters (Mini-Unlearning paper: lam = 0.005, sigma = 0.01).

    Attributes:
        l2: lam, per-sample (multiplies the mean loss).
        sigma: Std of the loss perturbation b.
        epsilon: Certification epsilon.
        delta: Certification delta.
        gamma: Lipschitz constant of l'' used in the bound (1/4 for logistic, as the code).
        max_iter: L-BFGS iterations of the training solve.
        seed: Seed of b.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    l2: float = Field(0.005, gt=0)
    sigma: float = Field(0.01, ge=0)
    epsilon: float = Field(1.0, gt=0)
    delta: float = Field(1e-4, gt=0, lt=1)
    gamma: float = Field(0.25, ge=0)
    max_iter: int = Field(500, ge=1)
    seed: int = Field(0, ge=0)


def certificate_constant(delta: float) -> float:
    """Return ``c = sqrt(2 ln(1.5 / delta))`` (Thm 3)."""
    return math.sqrt(2.0 * math.log(1.5 / delta))


def removal_budget(sigma: float, epsilon: float, delta: float) -> float:
    """Return the gradient-residual budget ``sigma epsilon / c`` (Thm 3: b ~ N(0, sigma^2 I)).

    A removal keeps (epsilon, delta)-certified removal while the residual bound stays within it;
    past it Alg. 2 retrains. A larger sigma (more noise in the objective) or epsilon (weaker
    guarantee) allows more residual.
    """
    # Thm 3: sigma >= c * beta / epsilon  <=>  beta <= sigma * epsilon / c
    return sigma * epsilon / certificate_constant(delta)


def _sigmoid(z: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(z)


def _objective(
    w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, l2: float, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return L_b and its gradient for C one-vs-rest models (w: C x d, y: n x C in {-1, 1})."""
    margins = y * (x @ w.T)
    loss = torch.nn.functional.softplus(-margins).sum() + 0.5 * l2 * len(x) * (w * w).sum()
    loss = loss + (b * w).sum()
    coef = -y * _sigmoid(-margins)  # d loss / d score
    grad = coef.T @ x + l2 * len(x) * w + b
    return loss, grad


def _hvp(w: torch.Tensor, x: torch.Tensor, l2: float, v: torch.Tensor) -> torch.Tensor:
    """Return ``(sum_i hess l_i + lam n I) v`` per class (w, v: C x d)."""
    scores = x @ w.T
    curv = _sigmoid(scores) * _sigmoid(-scores)
    return (curv * (x @ v.T)).T @ x + l2 * len(x) * v


def _conjugate_gradient(
    apply: Callable[[torch.Tensor], torch.Tensor],
    rhs: torch.Tensor,
    tol: float = 1e-12,
    max_iter: int = 500,
) -> torch.Tensor:
    """Solve ``apply(u) = rhs`` per row block (SPD) by CG on the flattened system."""
    u = torch.zeros_like(rhs)
    r = rhs.clone()
    p = r.clone()
    rs = float((r * r).sum())
    target = tol * max(float((rhs * rhs).sum()), 1e-300)
    for _ in range(max_iter):
        if rs <= target:
            break
        ap = apply(p)
        alpha = rs / float((p * ap).sum())
        u += alpha * p
        r -= alpha * ap
        rs_new = float((r * r).sum())
        p = r + (rs_new / rs) * p
        rs = rs_new
    return u


def newton_update(
    w: torch.Tensor,
    removed_gradient: torch.Tensor,
    kept_hvp: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, float]:
    """Return ``w + H^{-1} Delta`` (Guo et al. Eq. 3) and the solve's residual ``||H u - Delta||``.

    Args:
        w: The model trained on all the data (any shape; ``kept_hvp`` takes and returns it).
        removed_gradient: ``Delta``: the gradient at ``w`` of what removal takes out of the
            objective (the removed points' losses and their share of the regulariser).
        kept_hvp: ``v -> H v`` with ``H`` the Hessian at ``w`` of the objective that stays (the
            kept points' losses plus its regulariser): never the removed points.

    For a quadratic objective the update is exactly the minimiser of the kept objective.
    """
    step = _conjugate_gradient(kept_hvp, removed_gradient)
    residual = float((kept_hvp(step) - removed_gradient).norm())
    return w + step, residual


def newton_removal(
    w: torch.Tensor,
    x_kept: torch.Tensor,
    y_kept: torch.Tensor,
    x_gone: torch.Tensor,
    y_gone: torch.Tensor,
    l2: float,
) -> torch.Tensor:
    """Return ``w + H^{-1} Delta`` (Guo et al. Eq. 3) for logistic OvR models (w: C x d).

    ``Delta = r lam w + sum_{U} grad l_i(w)``; ``H`` is the Hessian of the unperturbed loss on
    the kept data plus ``lam (n - r) I`` (b is linear, so it cancels from both).
    """
    return _removal(w, x_kept, x_gone, y_gone, l2)[0]


def _removal(
    w: torch.Tensor, x_kept: torch.Tensor, x_gone: torch.Tensor, y_gone: torch.Tensor, l2: float
) -> tuple[torch.Tensor, float]:
    margins = y_gone * (x_gone @ w.T)
    delta = (-y_gone * _sigmoid(-margins)).T @ x_gone + l2 * len(x_gone) * w
    return newton_update(w, delta, lambda v: _hvp(w, x_kept, l2, v))


def _spectral_norm(x: torch.Tensor, iters: int = 30) -> float:
    v = torch.ones(x.shape[1], dtype=x.dtype) / math.sqrt(x.shape[1])
    for _ in range(iters):
        v = x.T @ (x @ v)
        v /= v.norm()
    return float((x @ v).norm())


@register("certified_removal")
class CertifiedRemoval(CentralUnlearner):
    """Certified Data Removal with one-vs-rest logistic models."""

    params_type = CertifiedRemovalParams

    def __init__(self, params: BaseModel | Mapping[str, Any] | None = None) -> None:
        super().__init__(params)
        # (objective trained on, w*, b, feature scale, training facts)
        self._state: tuple[Objective, torch.Tensor, torch.Tensor, float, dict[str, Any]] | None = (
            None
        )

    def _data(self, objective: Objective) -> tuple[torch.Tensor, torch.Tensor, float]:
        if not isinstance(objective, SoftmaxRegression):
            raise ConfigError(
                "certified_removal needs a SoftmaxRegression objective (linear model)"
            )
        x1 = torch.cat([objective.x, torch.ones(len(objective.x), 1, dtype=torch.float64)], 1)
        scale = float(x1.norm(dim=1).max())
        y = -torch.ones(len(x1), objective.num_outputs, dtype=torch.float64)
        y[torch.arange(len(x1)), objective.y] = 1.0
        return x1 / scale, y, scale

    def prepare(self, objective: Objective, record: TrainingRecord) -> None:
        """Train the loss-perturbed OvR models (Alg. 1), once per objective; not timed."""
        if self._state is not None and self._state[0] is objective:  # same data: reuse
            return
        start = time.perf_counter()
        x, y, scale = self._data(objective)
        classes, dim = y.shape[1], x.shape[1]
        generator = torch.Generator().manual_seed(self.params.seed)
        b = self.params.sigma * torch.randn(classes, dim, dtype=torch.float64, generator=generator)

        def fun(flat: np.ndarray) -> tuple[float, np.ndarray]:
            w = torch.from_numpy(flat).view(classes, dim)
            loss, grad = _objective(w, x, y, self.params.l2, b)
            return float(loss), grad.reshape(-1).numpy()

        res = minimize(
            fun,
            np.zeros(classes * dim),
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": self.params.max_iter, "gtol": 1e-10, "ftol": 1e-15},
        )
        w = torch.from_numpy(res.x).view(classes, dim).clone()
        info = {
            "train_seconds": time.perf_counter() - start,
            "train_grad_norm": float(np.linalg.norm(res.jac)),
            "feature_scale": scale,
        }
        self._state = (objective, w, b, scale, info)

    def _to_linear(self, w: torch.Tensor, scale: float) -> torch.Tensor:
        return torch.cat([(w[:, :-1] / scale).reshape(-1), w[:, -1] / scale])

    def original(self, objective: Objective, record: TrainingRecord) -> torch.Tensor:
        """Return the removal-enabled model before any removal."""
        self.prepare(objective, record)
        assert self._state is not None
        return self._to_linear(self._state[1], self._state[3])

    def _unlearn(
        self, objective: Objective, record: TrainingRecord, forget: torch.Tensor
    ) -> Outcome:
        assert self._state is not None
        _, w, _, scale, info = self._state
        x, y, _ = self._data(objective)
        mask = forget_mask(objective.num_samples, forget)
        w_new, solve_residual = _removal(w, x[~mask], x[mask], y[mask], self.params.l2)
        u = w_new - w
        x_kept = x[~mask]
        norm_x = _spectral_norm(x_kept)
        # Cor. 1: ||grad L'(w-)|| <= gamma ||X|| ||u|| ||X u|| per class, for exact solves
        newton = sum(
            self.params.gamma * norm_x * float(u[c].norm()) * float((x_kept @ u[c]).norm())
            for c in range(len(u))
        )
        bound = newton + info["train_grad_norm"] + solve_residual
        budget = removal_budget(self.params.sigma, self.params.epsilon, self.params.delta)
        details = {
            **info,
            "bound_newton": newton,
            "train_residual": info["train_grad_norm"],
            "solve_residual": solve_residual,
            "bound": bound,
            "budget": budget,
            "would_retrain": bool(bound > budget),
        }
        stored = 2 * w.numel() * w.element_size()  # w* and b (the data itself not counted)
        return Outcome(self._to_linear(w_new, scale), stored, len(x), details)
