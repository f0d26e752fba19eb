"""Per-sample L2-regularised objectives: sums of gradients and Hessian-vector products.

Every centralised method works on an objective whose per-sample term already carries the
regulariser, ``F_j(w) = loss(w; x_j, y_j) + (lam/2) ||w||^2`` (Deviation MU11), and asks
for *sums* over index sets: ``grad_sum(w, idx) = sum_{j in idx} grad F_j(w)`` and
``hvp_sum(w, idx, v) = sum_{j in idx} hess F_j(w) v``. Parameters are one float64 vector in the
order of ``torch.nn.Linear`` (weight ``C x d`` row-major, then bias ``C``), so a vector plugs into
``models.LogisticRegression`` with ``set_flat_params``.

- ``SoftmaxRegression``: multinomial logistic regression, closed-form gradients and HVPs.
- ``RidgeRegression``: squared loss (constant Hessian), the quadratic of verification MUV1
  (docs/methods/mini_unlearning.md).
- ``AutogradObjective``: any torch model, gradients by autograd and exact HVPs by double
  backprop; the generic path, checked against the closed forms in the tests.

Paper: Huang et al., "Machine Unlearning with Minimal Gradient Dependence for High Unlearning
Ratios", §3 (per-sample objective F_j), §5.1 (L2-regularised logistic regression, lam = 0.005).
Deviations (docs/methods/mini_unlearning.md):
    MU11 The regulariser sits in every per-sample term and covers the bias too, so it cancels in
    G(l) and shows in H(l) as ``-eta lam I``; no optimiser weight decay.
    MU14 Binary tasks (HIGGS) use two-class softmax; the L2 term keeps it strongly convex.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn
from torch.func import functional_call

__all__ = ["AutogradObjective", "Objective", "RidgeRegression", "SoftmaxRegression"]


class Objective(Protocol):
    """What the centralised methods need from a per-sample objective (sums over index sets)."""

    num_samples: int
    num_params: int
    l2: float

    def grad_sum(self, w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Return ``sum_{j in idx} grad F_j(w)`` (regulariser included)."""
        ...

    def hvp_sum(self, w: torch.Tensor, idx: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Return ``sum_{j in idx} hess F_j(w) v`` (regulariser included)."""
        ...

    def loss_sum(self, w: torch.Tensor, idx: torch.Tensor) -> float:
        """Return ``sum_{j in idx} F_j(w)``."""
        ...


class _Linear:
    """Shared layout of the linear objectives: ``w = [W (C x d) row-major, b (C)]``."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, num_outputs: int, l2: float) -> None:
        if x.ndim != 2 or y.shape[0] != x.shape[0]:
            raise ValueError(f"x must be (N, d) and y (N,); got {tuple(x.shape)}, {tuple(y.shape)}")
        if l2 < 0:
            raise ValueError(f"l2 must be >= 0; got {l2}")
        self.x = x.to(torch.float64)
        self.y = y
        self.l2 = float(l2)
        self.num_outputs = num_outputs
        self.num_features = x.shape[1]
        self.num_samples = x.shape[0]
        self.num_params = num_outputs * (self.num_features + 1)

    def split(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the weight matrix ``(C, d)`` and bias ``(C,)`` views of a flat vector."""
        c, d = self.num_outputs, self.num_features
        return w[: c * d].view(c, d), w[c * d :]

    def scores(self, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Return ``x W^T + b`` for inputs ``x`` of shape ``(n, d)``."""
        weight, bias = self.split(w)
        return x.to(w.dtype) @ weight.T + bias

    def _pack(self, resid: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
        """Return ``[resid^T xs, resid.sum(0)]`` flattened (the chain rule of the linear map)."""
        return torch.cat([(resid.T @ xs).reshape(-1), resid.sum(0)])


class SoftmaxRegression(_Linear):
    """Multinomial logistic regression with per-sample L2, closed-form gradients and HVPs.

    Args:
        x: Inputs ``(N, d)`` (flattened; cast to float64).
        y: Labels ``(N,)`` in ``0..num_classes-1``.
        num_classes: C.
        l2: lam in ``(lam/2) ||w||^2`` per sample.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, num_classes: int, l2: float) -> None:
        super().__init__(x.flatten(1), y.to(torch.int64), num_classes, l2)

    def _probs(self, w: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xs = self.x[idx]
        return torch.softmax(self.scores(w, xs), dim=1), xs

    def grad_sum(self, w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Return ``sum_j grad F_j(w)``: ``(pi_j - e_{y_j}) x_j^T`` terms plus ``lam |idx| w``."""
        if len(idx) == 0:
            return torch.zeros_like(w)
        probs, xs = self._probs(w, idx)
        probs[torch.arange(len(idx)), self.y[idx]] -= 1.0
        return self._pack(probs, xs) + self.l2 * len(idx) * w

    def hvp_sum(self, w: torch.Tensor, idx: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Return ``sum_j hess F_j(w) v``; ``a_j = (diag(pi_j) - pi_j pi_j^T) (V x_j + v_b)``."""
        if len(idx) == 0:
            return torch.zeros_like(w)
        probs, xs = self._probs(w, idx)
        z = self.scores(v, xs)  # V x_j + v_b
        a = probs * z - probs * (probs * z).sum(1, keepdim=True)
        return self._pack(a, xs) + self.l2 * len(idx) * v

    def loss_sum(self, w: torch.Tensor, idx: torch.Tensor) -> float:
        """Return ``sum_j [CE_j(w) + (lam/2) ||w||^2]``."""
        logp = torch.log_softmax(self.scores(w, self.x[idx]), dim=1)
        ce = -logp[torch.arange(len(idx)), self.y[idx]].sum()
        return float(ce + 0.5 * self.l2 * len(idx) * (w @ w))


class RidgeRegression(_Linear):
    """Squared loss ``(1/2)(w^T x + b - y)^2`` with per-sample L2: a quadratic (verification MUV1).

    Args:
        x: Inputs ``(N, d)``.
        y: Real targets ``(N,)``.
        l2: lam.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, l2: float) -> None:
        super().__init__(x.flatten(1), y.to(torch.float64), 1, l2)

    def grad_sum(self, w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Return ``sum_j (w^T x_j + b - y_j) [x_j; 1] + lam |idx| w``."""
        xs = self.x[idx]
        resid = self.scores(w, xs) - self.y[idx, None]
        return self._pack(resid, xs) + self.l2 * len(idx) * w

    def hvp_sum(self, w: torch.Tensor, idx: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Return ``sum_j [x_j; 1][x_j; 1]^T v + lam |idx| v`` (independent of w)."""
        xs = self.x[idx]
        return self._pack(self.scores(v, xs), xs) + self.l2 * len(idx) * v

    def loss_sum(self, w: torch.Tensor, idx: torch.Tensor) -> float:
        """Return ``sum_j [(1/2) r_j^2 + (lam/2) ||w||^2]``."""
        resid = self.scores(w, self.x[idx]) - self.y[idx, None]
        return float(0.5 * (resid**2).sum() + 0.5 * self.l2 * len(idx) * (w @ w))


class AutogradObjective:
    """Cross-entropy of any torch classifier with per-sample L2; autograd gradients and HVPs.

    The model runs in float64 on a functional copy, so the template is never modified.

    Args:
        model: Template module (its parameter order defines the flat layout).
        x: Inputs ``(N, ...)`` the model accepts.
        y: Labels ``(N,)``.
        l2: lam.
    """

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, l2: float) -> None:
        import copy

        self.model = copy.deepcopy(model).to(torch.float64)
        self.names = [n for n, _ in self.model.named_parameters()]
        self.shapes = [p.shape for _, p in self.model.named_parameters()]
        self.x = x.to(torch.float64)
        self.y = y.to(torch.int64)
        self.l2 = float(l2)
        self.num_samples = x.shape[0]
        self.num_params = sum(p.numel() for p in self.model.parameters())

    def _loss(self, w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        params, offset = {}, 0
        for name, shape in zip(self.names, self.shapes, strict=True):
            n = shape.numel()
            params[name] = w[offset : offset + n].view(shape)
            offset += n
        logits = functional_call(self.model, params, (self.x[idx],))
        ce = nn.functional.cross_entropy(logits, self.y[idx], reduction="sum")
        return ce + 0.5 * self.l2 * len(idx) * (w @ w)

    def grad_sum(self, w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Return ``sum_j grad F_j(w)`` by autograd."""
        w = w.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(self._loss(w, idx), w)
        return grad

    def hvp_sum(self, w: torch.Tensor, idx: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Return ``sum_j hess F_j(w) v`` by double backprop."""
        w = w.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(self._loss(w, idx), w, create_graph=True)
        (hv,) = torch.autograd.grad(grad @ v, w)
        return hv

    def loss_sum(self, w: torch.Tensor, idx: torch.Tensor) -> float:
        """Return ``sum_j F_j(w)``."""
        with torch.no_grad():
            return float(self._loss(w, idx))
