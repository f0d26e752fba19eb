"""The affine recursion ``dw_l = G(l) + H(l) dw_{l-1}`` and three ways to unroll its last k steps.

- ``correction``: ``G(l)`` of Eq. 7 with the sign fix and the special cases ``dB = 0`` and
  ``dB = B``;
- ``unroll`` (``engine``; also as ``unroll_horner``, ``unroll_explicit``, ``unroll_terms``):
  ``horner``: ``D <- 0; for l = T-k+1..T: D <- G(l) + H(l) D`` (Eq. 10 in Horner form, k HVPs);
  ``explicit``: builds each ``H(l)`` as a p x p matrix from its action on the standard basis in
  a process pool, then sums Eq. 10 with explicit products (Algorithm 3 with fixed indices,
  Eq. 11); ``terms``: the matrix-free Eq. 10: term j is ``H(T)..H(T-j+2) G(T-j+1)``, each
  computed independently (O(k^2) HVPs);
- ``spectral_norm`` and ``contraction_diagnostics``: ``||H(l)||_2`` by power iteration and the
  truncation bound of Theorem 1 (verification MUV8).

Listings B (Horner) and C (Algorithm 3, fixed) and the verification experiments MUV1-MUV10 are in
docs/methods/mini_unlearning.md.

Paper: Huang et al., "Machine Unlearning with Minimal Gradient Dependence for High Unlearning
Ratios", §4.1 (Eq. 6-10, Theorem 1), §4.2 (Algorithm 3, Eq. 11).
Deviations (docs/methods/mini_unlearning.md):
    MU1 [FIX] The forgotten-sample term of G enters with ``+`` (Eq. 7); the printed Eq. 6 and
    Appendix A's Eq. 13 have ``-``. ``sign=-1`` reproduces the printed variant for the
    regression test only.
    MU2 [FIX] ``dB = 0`` gives ``G = 0`` but ``H != I``; ``dB = B`` gives ``G = w_{l-1} - w_l``
    and ``H = I``.
    MU3 [FIX] Algorithm 3's indices: Eq. 10 uses G(T-k+1..T) and H(T-k+2..T) at
    ``w_{T-k}..w_{T-1}``.
    MU4 [FIX] Algorithm 1 is not implemented verbatim; its intent, Eq. 10, is (three engines).
    MU7 [FIX] Theorem 1's bound is ``O(r^k ||dw_{T-k}||)`` with ``r = max ||H(l)||_2``, not
    o(r^k).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

import torch

from fedunlearn.central.objectives import Objective

if TYPE_CHECKING:
    from fedunlearn.central.hvp import HessianOracle
    from fedunlearn.central.trainer import TrainingRecord

#: How ``unroll`` sums Eq. 10 (see ``unroll``).
Engine = Literal["horner", "terms", "explicit"]

__all__ = [
    "Engine",
    "StepView",
    "contraction_diagnostics",
    "correction",
    "spectral_norm",
    "step_view",
    "unroll",
    "unroll_explicit",
    "unroll_horner",
    "unroll_terms",
]


def correction(
    objective: Objective,
    w_prev: torch.Tensor,
    w_next: torch.Tensor,
    batch: torch.Tensor,
    forgotten: torch.Tensor,
    lr: float,
    *,
    batch_grad: torch.Tensor | None = None,
    shortcut: bool = True,
    sign: int = 1,
) -> torch.Tensor:
    """Return ``G(l)`` (Eq. 7, corrected sign: Deviations MU1, MU2).

    ``G = (eta/B) [ -(dB/(B-dB)) sum_{R} grad F_j + sign * sum_{Bbar} grad F_j ]`` at ``w_{l-1}``.

    Args:
        objective: Per-sample objective.
        w_prev: ``w_{l-1}``.
        w_next: ``w_l``.
        batch: ``B_l``.
        forgotten: ``Bbar_l = B_l cap D_U``.
        lr: eta.
        batch_grad: ``sum_{B_l} grad F_j(w_{l-1})`` if already known (paper mode).
        shortcut: Obtain the batch-gradient sum as ``(B/eta)(w_{l-1} - w_l)`` (Eq. 3; MU13).
        sign: ``+1`` (Eq. 7, correct) or ``-1`` (the printed Eq. 6; regression tests only).
    """
    size, removed = len(batch), len(forgotten)
    if removed == 0:
        return torch.zeros_like(w_prev)
    if removed == size:  # [FIX] the retrained step is a no-op
        return w_prev - w_next
    grad_forgotten = objective.grad_sum(w_prev, forgotten)
    if batch_grad is None:
        batch_grad = (
            (size / lr) * (w_prev - w_next) if shortcut else objective.grad_sum(w_prev, batch)
        )
    grad_retained = batch_grad - grad_forgotten
    # Eq. 7: gamma_l / (1 + gamma_l) = -dB / (B - dB).
    return (lr / size) * (-(removed / (size - removed)) * grad_retained + sign * grad_forgotten)


@dataclass(frozen=True)
class StepView:
    """Everything about step l that G(l) and H(l) need.

    Attributes:
        step: l (1-based).
        w_prev: ``w_{l-1}``.
        w_next: ``w_l``.
        batch: ``B_l``.
        retained: ``R_l``.
        forgotten: ``Bbar_l``.
        lr: eta.
    """

    step: int
    w_prev: torch.Tensor
    w_next: torch.Tensor
    batch: torch.Tensor
    retained: torch.Tensor
    forgotten: torch.Tensor
    lr: float


def step_view(record: TrainingRecord, mask: torch.Tensor, step: int) -> StepView:
    """Return the ``StepView`` of ``step`` under the forget mask (raises if iterates are absent)."""
    batch = record.batch(step)
    gone = mask[batch]
    return StepView(
        step,
        record.iterate(step - 1),
        record.iterate(step),
        batch,
        batch[~gone],
        batch[gone],
        record.spec.lr,
    )


def _corrections(
    objective: Objective,
    views: Sequence[StepView],
    stored: dict[int, torch.Tensor],
    shortcut: bool,
    sign: int,
) -> list[torch.Tensor]:
    return [
        stored[v.step]
        if v.step in stored
        else correction(
            objective, v.w_prev, v.w_next, v.batch, v.forgotten, v.lr, shortcut=shortcut, sign=sign
        )
        for v in views
    ]


def unroll(
    objective: Objective,
    views: Sequence[StepView],
    oracle: HessianOracle,
    *,
    engine: Engine = "horner",
    workers: int = 2,
    stored: dict[int, torch.Tensor] | None = None,
    shortcut: bool = True,
    sign: int = 1,
) -> torch.Tensor:
    """Return ``dw_T``, the sum of Eq. 10 over the window, by one of three engines.

    ``horner``: ``D <- 0; for l: D <- G(l) + H(l) D`` (Listing B; k HVPs). ``terms``: Eq. 10's k
    independent matrix-free terms (O(k^2) HVPs). ``explicit``: Algorithm 3 with fixed indices
    (Eq. 10-11): each ``H(l) = sum_q (H(l) e_q) e_q^T`` built from p HVPs in ``workers`` processes
    (standard basis), then ``D = G(T); P = I; for j = 2..k: P <- P H(T-j+2); D += P G(T-j+1)``;
    feasible only for small p (O(p^2) memory per matrix, p HVPs per step).

    Args:
        objective: Per-sample objective.
        views: Steps ``T-k+1..T`` in order.
        oracle: ``H(l) v`` (and ``matrix(view)`` for ``explicit``: picklable if ``workers > 1``).
        engine: ``horner``, ``terms`` or ``explicit``.
        workers: Worker processes of the ``explicit`` engine (``<= 1`` builds in this process).
        stored: Precomputed G(l) (paper mode); recomputed post hoc when absent.
        shortcut: See ``correction``.
        sign: See ``correction``.
    """
    gs = _corrections(objective, views, stored or {}, shortcut, sign)
    if engine == "horner":
        delta = torch.zeros_like(views[0].w_prev)
        for view, g in zip(views, gs, strict=True):
            delta = g + oracle.apply(view, delta)  # Eq. 6: dw_l = G(l) + H(l) dw_{l-1}
        return delta
    if engine == "terms":
        total = torch.zeros_like(views[0].w_prev)
        for j in range(len(views)):  # term for G(view j): push through H of every later step
            term = gs[j]
            for view in views[j + 1 :]:
                term = oracle.apply(view, term)
            total += term
        return total
    return _unroll_explicit(views, oracle, gs, workers)


#: ``unroll`` by Horner over the window (Eq. 10; Listing B): k HVPs.
unroll_horner = partial(unroll, engine="horner")
#: ``unroll`` as the sum of Eq. 10's k independent matrix-free terms (O(k^2) HVPs).
unroll_terms = partial(unroll, engine="terms")
#: ``unroll`` from explicit ``H(l)`` matrices built in parallel (Algorithm 3, Eq. 10-11).
unroll_explicit = partial(unroll, engine="explicit")


_WORKER_ORACLE: Any = None


def _init_worker(oracle: HessianOracle) -> None:
    global _WORKER_ORACLE
    torch.set_num_threads(1)
    _WORKER_ORACLE = oracle


def _matrix_in_worker(view: StepView) -> torch.Tensor:
    return _WORKER_ORACLE.matrix(view)


def _unroll_explicit(
    views: Sequence[StepView], oracle: HessianOracle, gs: list[torch.Tensor], workers: int
) -> torch.Tensor:
    later = list(views[1:])  # H(T-k+2..T)
    if workers > 1 and later:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(
            max_workers=workers, mp_context=context, initializer=_init_worker, initargs=(oracle,)
        ) as pool:
            mats = list(pool.map(_matrix_in_worker, later))
    else:
        mats = [oracle.matrix(v) for v in later]
    delta = gs[-1].clone()
    product = torch.eye(len(delta), dtype=delta.dtype)
    for j in range(2, len(views) + 1):  # Eq. 10
        product = product @ mats[-(j - 1)]  # P <- P H(T-j+2)
        delta += product @ gs[-j]
    return delta


def spectral_norm(
    apply: Callable[[torch.Tensor], torch.Tensor], dim: int, *, iters: int = 100, seed: int = 0
) -> float:
    """Return ``||A||_2`` of a symmetric operator by power iteration (a lower estimate)."""
    v = torch.randn(dim, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    v /= v.norm()
    estimate = 0.0
    for _ in range(iters):
        u = apply(v)
        estimate = float(u.norm())
        if estimate == 0.0:
            return 0.0
        v = u / estimate
    return estimate


def contraction_diagnostics(
    views: Sequence[StepView], oracle: HessianOracle, *, iters: int = 100
) -> dict[str, Any]:
    """Return ``||H(l)||_2`` per step (power iteration) and ``r = max_l ||H(l)||_2`` (Theorem 1)."""
    dim = len(views[0].w_prev)
    norms = [
        spectral_norm(lambda v, s=s: oracle.apply(s, v), dim, iters=iters)  # type: ignore[misc]
        for s in views  # (mypy infers no lambda with a default argument: s is bound per step)
    ]
    return {"steps": [v.step for v in views], "norms": norms, "r": max(norms)}
