"""Compact L-BFGS Hessian-vector products from secant pairs, with guards.

FedRecover and DeltaGrad estimate ``H v`` (an integrated Hessian, or the Jacobian of a local
update map, times the drift ``v`` between a new and an old trajectory) from *secant pairs*
``(s_j, y_j)``: ``s_j`` is the parameter difference between the two trajectories at the same
round or iteration, ``y_j`` the matching gradient difference. ``B`` is the BFGS matrix built from
``B_0 = sigma I`` by the pairs oldest -> newest, applied in the Byrd-Nocedal-Schnabel compact form
(never a p x p matrix; the two-loop recursion would give ``B^{-1} v`` instead)::

    A = S^T Y,  D = diag(A),  L = strictly lower part of A,  sigma = y_k^T s_k / s_k^T s_k
    M = [[-D, L^T], [L, sigma S^T S]]
    B v = sigma v - [Y, sigma S] M^{-1} [Y^T v; sigma S^T v]

Layers, bottom up:

- ``pair_problem``: guards (a) and (b) for one pair;
- ``CompactBFGS``: ``B v`` for a fixed list of pairs. The O(k^2 p) setup (``S^T Y``, ``S^T S``
  and ``M^{-1}``, all in float64) runs once in the constructor, with guard (c); each product then
  costs O(k p) and keeps the p-vectors in their own dtype (float32 in practice);
- ``SecantBuffer``: the newest ``capacity`` usable pairs, screened on entry, with the
  ``CompactBFGS`` cached until the next push;
- ``compact_hvp``: one-shot ``B v`` from p x k matrices (tests, DeltaGrad's period cache).

Paper: Byrd, Nocedal, Schnabel, "Representations of quasi-Newton matrices and their use in limited
memory methods", Math. Programming 63 (1994), Thm. 2.3 (compact BFGS form); used this way by
DeltaGrad (Wu et al., ICML 2020; authors' ``cal_approx_hessian_vec_prod0_3``) and FedRecover
(Cao et al., IEEE S&P 2023).

Deviations (tags of docs/methods/baselines.md, "Shared: compact L-BFGS"):
    LB1 guards: (a) a pair with ``||s|| <= 1e-12 (1 + ||w||)`` is skipped (the first round
    of a recovery, or nothing removed); (b) a pair with ``s^T y <= 1e-10 ||s|| ||y||`` is skipped
    (curvature not positive); (c) if ``M`` is singular, non-finite or ``cond(M) > 1e12`` the oldest
    pair is dropped and the setup retried; (d) no usable pair raises ``NoCurvaturePairsError`` so
    the caller falls back to exact work. ``GuardCounts`` records how often each fires.
    LB2 sigma uses the newest pair, as in the DeltaGrad authors' code (inferred: FedRecover's
    own L-BFGS listing was not read).
    LB3 ``SecantBuffer`` screens pairs on entry, so a skipped pair never takes a slot: the buffer
    holds the newest ``capacity`` *usable* pairs. Guard (c) is applied per setup and does not
    remove the pair from the buffer (a newer pair may make the set well conditioned again).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from fedunlearn.errors import FedUnlearnError

__all__ = [
    "CompactBFGS",
    "GuardCounts",
    "NoCurvaturePairsError",
    "SecantBuffer",
    "compact_hvp",
    "pair_problem",
    "step_stats",
]

# Guard thresholds of Deviation LB1.
DEGENERATE_STEP_RTOL = 1e-12  # (a) ||s|| <= 1e-12 (1 + ||w||)
CURVATURE_RTOL = 1e-10  # (b) s^T y <= 1e-10 ||s|| ||y||
MAX_CONDITION = 1e12  # (c) cond(M) above this drops the oldest pair

Pair = tuple[torch.Tensor, torch.Tensor]


class NoCurvaturePairsError(FedUnlearnError, ArithmeticError):
    """No usable secant pair is left, so ``B v`` cannot be estimated; compute exactly instead."""


@dataclass
class GuardCounts:
    """How often each guard of Deviation LB1 fired.

    Attributes:
        degenerate_step: Pairs skipped because ``s`` was (numerically) zero (guard a).
        nonpositive_curvature: Pairs skipped because ``s^T y`` was not positive (guard b).
        ill_conditioned: Oldest pairs dropped from a setup whose ``M`` was singular or had
            ``cond(M) > 1e12`` (guard c).
        no_pairs: Products requested with no usable pair left (guard d).
    """

    degenerate_step: int = 0
    nonpositive_curvature: int = 0
    ill_conditioned: int = 0
    no_pairs: int = 0

    def to_dict(self) -> dict[str, int]:
        """Return the counts as a JSON-ready dict."""
        return asdict(self)


def step_stats(s: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Return ``s`` in float64 and its norm: what ``pair_problem`` computes from ``s``.

    A caller that pairs one ``s`` with many ``y`` (FedRecover: one step, every client's
    gradient difference) computes them once and passes them on.
    """
    s64 = s.to(torch.float64)
    return s64, float(s64.norm())


def pair_problem(
    s: torch.Tensor,
    y: torch.Tensor,
    w_norm: float = 0.0,
    stats: tuple[torch.Tensor, float] | None = None,
) -> str | None:
    """Return why a secant pair is unusable (guards a and b), or None if it is usable.

    Args:
        s: Parameter difference (p-vector).
        y: Gradient difference (p-vector).
        w_norm: Norm of the current parameters, the scale of guard (a).
        stats: ``step_stats(s)``, if the caller has it (the same numbers, not recomputed).

    Returns:
        ``"degenerate_step"``, ``"nonpositive_curvature"`` or None.
    """
    s64, s_norm = step_stats(s) if stats is None else stats
    y64 = y.to(torch.float64)
    # Guard (a): the trajectories have not separated (or nothing was removed).
    if not math.isfinite(s_norm) or s_norm <= DEGENERATE_STEP_RTOL * (1.0 + w_norm):
        return "degenerate_step"
    # Guard (b): curvature along s must be positive for a positive-definite BFGS matrix.
    y_norm = float(y64.norm())
    curvature = float(s64 @ y64)
    if not math.isfinite(curvature) or curvature <= CURVATURE_RTOL * s_norm * y_norm:
        return "nonpositive_curvature"
    return None


class CompactBFGS:
    """``B v`` for a fixed list of secant pairs, in compact form with the setup done once.

    Steps: the constructor forms ``S^T Y`` and ``S^T S`` (float64), sigma from the newest pair,
    ``M`` and ``M^{-1}``, dropping oldest pairs while ``M`` is unusable (guard c); ``matvec``
    then computes ``q = [Y^T v; sigma S^T v]``, ``z = M^{-1} q`` and ``sigma v - [Y, sigma S] z``.

    The pairs are kept by reference (no copy), so the object adds O(k^2) memory to the buffer.

    Args:
        pairs: ``(s_j, y_j)`` p-vectors, oldest first. Guards (a) and (b) are the caller's
            business (``pair_problem``, or ``SecantBuffer``).
        counts: Where guard (c) firings are added, if given.
        max_condition: Largest acceptable ``cond(M)``.

    Raises:
        NoCurvaturePairsError: if ``pairs`` is empty or guard (c) drops them all.
    """

    def __init__(
        self,
        pairs: Sequence[Pair],
        counts: GuardCounts | None = None,
        max_condition: float = MAX_CONDITION,
    ) -> None:
        pairs = list(pairs)
        if not pairs:
            raise NoCurvaturePairsError("no secant pair to build the L-BFGS matrix from")
        newest_s = pairs[-1][0].to(torch.float64)
        newest_y = pairs[-1][1].to(torch.float64)
        # LB2: B_0 = sigma I with sigma = y_k^T s_k / s_k^T s_k (newest pair).
        self.sigma = float(newest_y @ newest_s) / float(newest_s @ newest_s)
        full_s = torch.stack([s.to(torch.float64) for s, _ in pairs])  # k x p, float64
        full_y = torch.stack([y.to(torch.float64) for _, y in pairs])
        sty_full = full_s @ full_y.T  # k x k, A = S^T Y
        sts_full = full_s @ full_s.T  # k x k
        del full_s, full_y
        for start in range(len(pairs)):
            m_inv = self._setup(sty_full[start:, start:], sts_full[start:, start:], max_condition)
            if m_inv is not None:
                break
            if counts is not None:
                counts.ill_conditioned += 1
        else:
            raise NoCurvaturePairsError(
                f"all {len(pairs)} secant pairs give an ill-conditioned compact BFGS system "
                f"(cond(M) > {max_condition:g})"
            )
        self.pairs: list[Pair] = pairs[start:]
        self.dropped = start
        self._m_inv = m_inv

    def _setup(
        self, sty: torch.Tensor, sts: torch.Tensor, max_condition: float
    ) -> torch.Tensor | None:
        """Return ``M^{-1}`` for the given blocks, or None if ``M`` is unusable (guard c)."""
        k = sty.shape[0]
        d = torch.diag(torch.diagonal(sty))  # D = diag(S^T Y)
        lower = torch.tril(sty, diagonal=-1)  # L_ij = (S^T Y)_ij for i > j
        m = torch.empty((2 * k, 2 * k), dtype=torch.float64)
        m[:k, :k] = -d
        m[:k, k:] = lower.T
        m[k:, :k] = lower
        m[k:, k:] = self.sigma * sts
        if not bool(torch.isfinite(m).all()):
            return None
        cond = float(torch.linalg.cond(m))
        if not math.isfinite(cond) or cond > max_condition:
            return None
        m_inv, info = torch.linalg.inv_ex(m)
        if int(info) != 0 or not bool(torch.isfinite(m_inv).all()):
            return None
        return m_inv

    @property
    def num_pairs(self) -> int:
        """Pairs used after guard (c)."""
        return len(self.pairs)

    def matvec(self, v: torch.Tensor) -> torch.Tensor:
        """Return ``B v`` in ``v``'s dtype (float64 small solve, O(k p) work)."""
        if not bool(v.any()):  # B 0 = 0, even with no pair
            return torch.zeros_like(v)
        k = len(self.pairs)
        # q = [Y^T v; sigma S^T v], accumulated in float64.
        q = torch.empty(2 * k, dtype=torch.float64)
        for j, (s, y) in enumerate(self.pairs):
            q[j] = float(torch.dot(y.to(v.dtype), v))
            q[k + j] = self.sigma * float(torch.dot(s.to(v.dtype), v))
        # z = M^{-1} q.
        z = (self._m_inv @ q).tolist()
        # B v = sigma v - [Y, sigma S] z.
        out = v * self.sigma
        for j, (s, y) in enumerate(self.pairs):
            out.sub_(y.to(v.dtype), alpha=z[j])
            out.sub_(s.to(v.dtype), alpha=self.sigma * z[k + j])
        return out


def compact_hvp(s_mat: torch.Tensor, y_mat: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Return ``B v`` for the pairs in the columns of ``s_mat`` and ``y_mat`` (compact form).

    Args:
        s_mat: p x k parameter differences, columns oldest -> newest.
        y_mat: p x k gradient differences, same order.
        v: p-vector.

    Returns:
        ``B v`` in ``v``'s dtype; zero if ``v`` is zero (even with no pair).

    Raises:
        NoCurvaturePairsError: with ``k == 0`` (and ``v != 0``), or if guard (c) drops every pair.
    """
    if s_mat.shape != y_mat.shape or s_mat.ndim != 2 or s_mat.shape[0] != v.shape[0]:
        raise ValueError(
            f"s_mat and y_mat must both be p x k with p = len(v) = {v.shape[0]}; got "
            f"{tuple(s_mat.shape)} and {tuple(y_mat.shape)}"
        )
    if not bool(v.any()):
        return torch.zeros_like(v)
    pairs = [(s_mat[:, j], y_mat[:, j]) for j in range(s_mat.shape[1])]
    return CompactBFGS(pairs).matvec(v)


class SecantBuffer:
    """The newest ``capacity`` usable secant pairs, with the compact setup cached between pushes.

    Args:
        capacity: Buffer size (FedRecover's s, DeltaGrad's m).
        counts: Shared guard counters (e.g. one per unlearning run); a fresh one if None.

    Example:
        >>> buf = SecantBuffer(2)
        >>> buf.push(torch.ones(3), 2 * torch.ones(3))
        True
        >>> buf.hvp(torch.tensor([1.0, 0.0, 0.0]))
        tensor([2., 0., 0.])
    """

    def __init__(self, capacity: int, counts: GuardCounts | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"SecantBuffer capacity must be >= 1; got {capacity}")
        self.capacity = capacity
        self.counts = counts if counts is not None else GuardCounts()
        self._pairs: deque[Pair] = deque(maxlen=capacity)
        # The setup of the current pairs, or the error it raised; None = not built since a push.
        self._cache: CompactBFGS | NoCurvaturePairsError | None = None

    def __len__(self) -> int:
        return len(self._pairs)

    @property
    def pairs(self) -> tuple[Pair, ...]:
        """The stored pairs, oldest first."""
        return tuple(self._pairs)

    def push(
        self,
        s: torch.Tensor,
        y: torch.Tensor,
        w_norm: float = 0.0,
        stats: tuple[torch.Tensor, float] | None = None,
    ) -> bool:
        """Add a pair unless guard (a) or (b) rejects it; return whether it was added.

        Args:
            s: Parameter difference (kept by reference; do not modify it afterwards).
            y: Gradient difference (kept by reference).
            w_norm: Norm of the current parameters, the scale of guard (a).
            stats: ``step_stats(s)``, if the caller has it.
        """
        problem = pair_problem(s, y, w_norm, stats)
        if problem is not None:
            setattr(self.counts, problem, getattr(self.counts, problem) + 1)
            return False
        self._pairs.append((s, y))
        self._cache = None
        return True

    def hvp(self, v: torch.Tensor) -> torch.Tensor:
        """Return ``B v`` from the buffered pairs.

        Raises:
            NoCurvaturePairsError: if ``v != 0`` and no usable pair is buffered (guard d; the
                caller computes exactly and counts it).
        """
        if not bool(v.any()):
            return torch.zeros_like(v)
        if self._cache is None:
            if not self._pairs:
                self._cache = NoCurvaturePairsError("the secant buffer holds no usable pair")
            else:
                try:
                    self._cache = CompactBFGS(self._pairs, self.counts)
                except NoCurvaturePairsError as err:
                    self._cache = err
        if isinstance(self._cache, NoCurvaturePairsError):
            self.counts.no_pairs += 1
            raise NoCurvaturePairsError(str(self._cache))
        return self._cache.matvec(v)
