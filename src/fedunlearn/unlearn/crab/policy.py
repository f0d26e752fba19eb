"""Crab's selective storage: loss windows, KL round scores, top-λ rounds, top-δ clients.

The server buffers rounds in a time window that closes once the loss on a fixed clean reference
set R fell by a fraction α since the window opened. At the close it keeps the λ-share of the
window's rounds that changed the model most (KL divergence of consecutive global models'
predictions on R) and, in each kept round, the δ-share of clients whose update is most aligned
with the round's aggregate (cosine). The last, partial window is flushed at the end of training.

``WindowSelector`` is the one implementation of this logic. The live recording policy
(:class:`CrabPolicy`, ``history.policy: crab``) feeds it each finished round; the ``crab``
unlearning method feeds it the stored rounds of a run recorded with ``all``. Both see the same
tensors (a stored tensor is the bit-exact copy of the live one), so both select the same rounds
and clients.

Paper: Jiang, Shen, Liu, Tan, Lam, "Towards Efficient and Certified Recovery from Poisoning
Attacks in Federated Learning", arXiv:2401.08216v2, Sec. IV-B1, Alg. 1 and Alg. 2 Stage I, Eq. 1
(KL) and Eq. 2 (cosine contribution score). Deviations ([Dn]): docs/methods/crab.md.

Deviations:
    [CB1] Eq. 1 is printed as KL[p(M_{i+1}) || p(M_i)] but expanded as Σ p(M_i) log(p(M_i) /
        p(M_{i+1})); the expanded form KL(p(M_t) || p(M_{t+1})) is used.
    [CB2] p(M) and F(M) are the softmax outputs and the mean cross-entropy on R, a seeded clean
        subsample (default 2,000) of the union of the clients' training data (the server cannot
        see D); probabilities are clamped at 1e-12 before logs. ``param_softmax_kl`` is the
        authors' code's parameter proxy: per parameter tensor, softmax over its last dimension,
        mean KL over rows, summed over tensors.
    [CB3] Round t is scored by the change its own updates caused, KL(p(M_{t-1}) || p(M_t)), so a
        window of B_b rounds has B_b scores (Alg. 1's i + 1 leaves the window for the last i).
    [CB4] P_b = max(1, round_half_up(λ B_b)), X = max(1, floor(δ C_t)) with C_t the round's
        aggregated clients; ``rounding: floor`` uses floor for P_b too (the authors' code).
        Products get a 1e-9 guard so 0.7 * 20 is 14. Ties: later round first, smaller client id
        first.
    [CB5] The partial last window is flushed at the end of training; ``max_window`` optionally
        closes a window after that many rounds.
    [CB6] Gbar (FedAvg of the kept clients) is not stored: it is the n_c-weighted mean of the
        stored updates and is recomputed at recovery time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from fedunlearn.errors import ConfigError
from fedunlearn.fl.metrics import predict_logits
from fedunlearn.fl.records import RoundRecord
from fedunlearn.history.policy import PolicyEnv, PolicySpec, register_policy
from fedunlearn.history.store import HistoryStore
from fedunlearn.unlearn.crab.params import CrabSelectionConfig, crab_options
from fedunlearn.unlearn.selection import count_floor, top_clients

if TYPE_CHECKING:
    from fedunlearn.config import HistoryConfig

PROB_FLOOR = 1e-12
_GUARD = 1e-9

Updates = Mapping[int, torch.Tensor]


def kl_divergence(p_old: torch.Tensor, p_new: torch.Tensor) -> float:
    """Return the mean over rows of KL(p_old || p_new) (Eq. 1, expanded form [CB1]).

    Args:
        p_old: Row-stochastic probabilities, shape (n, k).
        p_new: Same shape.
    """
    a = p_old.to(torch.float64).clamp_min(PROB_FLOOR)
    b = p_new.to(torch.float64).clamp_min(PROB_FLOOR)
    if a.ndim == 1:
        a, b = a.unsqueeze(0), b.unsqueeze(0)
    return float((a * (a.log() - b.log())).sum(dim=1).mean())


def rounds_to_keep(num_rounds: int, ratio: float, rounding: str = "half_up") -> int:
    """Return P_b: how many of a window's ``num_rounds`` rounds are kept [CB4]."""
    x = ratio * num_rounds
    count = math.floor(x + 0.5 + _GUARD) if rounding == "half_up" else math.floor(x + _GUARD)
    return max(1, min(num_rounds, count))


def clients_to_keep(num_clients: int, ratio: float) -> int:
    """Return X = max(1, floor(δ C_t))."""
    return count_floor(num_clients, ratio)


def select_rounds(
    scores: Mapping[int, float], ratio: float, rounding: str = "half_up"
) -> list[int]:
    """Return the P_b rounds with the largest score, ascending (ties: later round first)."""
    count = rounds_to_keep(len(scores), ratio, rounding)
    ranked = sorted(scores, key=lambda t: (-scores[t], -t))
    return sorted(ranked[:count])


def select_clients(updates: Updates, aggregate: torch.Tensor, ratio: float) -> list[int]:
    """Return the X clients most aligned with the aggregate (Eq. 2), ascending (ties: lower id)."""
    return top_clients(updates, aggregate, clients_to_keep(len(updates), ratio))


def close_windows(
    losses: Sequence[float], alpha: float, max_window: int | None = None
) -> list[int]:
    """Return the rounds at which windows close, given ``losses[t] = F(M_t)`` for t = 0..T.

    A window opened at round a (after M_a) closes at the first round t > a with
    ``F(M_t) <= (1 - alpha) F(M_a)`` (Alg. 2 lines 12-17), or after ``max_window`` rounds.
    """
    closes: list[int] = []
    start, start_loss = 0, losses[0] if losses else 0.0
    for t in range(1, len(losses)):
        if losses[t] <= (1 - alpha) * start_loss or (
            max_window is not None and t - start >= max_window
        ):
            closes.append(t)
            start, start_loss = t, losses[t]
    return closes


def window_bound(initial_loss: float, last_close_loss: float, alpha: float) -> int:
    """Return B = floor(log(1 - γ) / log(1 - α)), γ = 1 - F(last close) / F(M_0) (Sec. IV-B1)."""
    if initial_loss <= 0 or last_close_loss <= 0:
        raise ConfigError("the window bound needs positive losses")
    gamma = (initial_loss - last_close_loss) / initial_loss
    return math.floor(math.log(1 - gamma) / math.log(1 - alpha) + _GUARD)


@dataclass(frozen=True)
class ModelView:
    """What the scorer needs of one global model: F on R, softmax outputs, parameters."""

    loss: float
    probs: torch.Tensor
    params: torch.Tensor


class ReferenceScorer:
    """Loss and round divergence of global models on the clean reference set R.

    Args:
        model: The run's architecture (parameters are set from flat vectors on a copy).
        x: Reference inputs.
        y: Reference labels.
        divergence: ``pred_kl`` (default) or ``param_softmax_kl``.
    """

    def __init__(
        self,
        model: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        divergence: Literal["pred_kl", "param_softmax_kl"] = "pred_kl",
    ) -> None:
        if divergence not in ("pred_kl", "param_softmax_kl"):
            raise ConfigError(
                f"divergence must be 'pred_kl' or 'param_softmax_kl'; got {divergence!r}"
            )
        self.model = model
        self.x = x
        self.y = y
        self.divergence_kind = divergence
        self.shapes = [tuple(p.shape) for p in model.parameters()]

    def loss(self, params: torch.Tensor) -> float:
        """Return F(M): mean cross-entropy on R."""
        return self.view(params).loss

    def view(self, params: torch.Tensor) -> ModelView:
        """Return the loss, softmax outputs and parameters of ``params``."""
        logits = predict_logits(self.model, params, self.x)
        loss = float(F.cross_entropy(logits, self.y))
        return ModelView(loss, torch.softmax(logits.to(torch.float64), dim=1), params)

    def divergence(self, old: ModelView, new: ModelView) -> float:
        """Return the score of the round that turned ``old`` into ``new`` (KL(old || new))."""
        if self.divergence_kind == "pred_kl":
            return kl_divergence(old.probs, new.probs)
        total, offset = 0.0, 0
        for shape in self.shapes:
            n = math.prod(shape)
            cols = shape[-1] if shape else 1
            a = old.params[offset : offset + n].reshape(-1, cols).to(torch.float64)
            b = new.params[offset : offset + n].reshape(-1, cols).to(torch.float64)
            total += kl_divergence(torch.softmax(a, dim=1), torch.softmax(b, dim=1))
            offset += n
        return total


@dataclass(frozen=True)
class WindowRecord:
    """One window: its rounds and scores, the kept rounds and their kept clients."""

    rounds: tuple[int, ...]
    scores: tuple[float, ...]
    losses: tuple[float, ...]
    closed: bool  # False: the partial last window, flushed at the end of training
    kept: Mapping[int, tuple[int, ...]]


@dataclass
class _Buffered:
    round: int
    score: float
    aggregate: torch.Tensor
    updates: Callable[[], Updates]


@dataclass
class WindowSelector:
    """Online Stage I selection: feed finished rounds in order, get the kept ones per window.

    Args:
        scorer: Loss and divergence on R.
        alpha: α.
        round_ratio: λ.
        client_ratio: δ.
        rounding: ``half_up`` or ``floor`` for P_b.
        max_window: Optional window length cap.
    """

    scorer: ReferenceScorer
    alpha: float
    round_ratio: float
    client_ratio: float
    rounding: str = "half_up"
    max_window: int | None = None
    windows: list[WindowRecord] = field(default_factory=list)
    _prev: ModelView | None = None
    _start_loss: float = 0.0
    _buffer: list[_Buffered] = field(default_factory=list)
    _losses: list[float] = field(default_factory=list)

    def start(self, params: torch.Tensor) -> None:
        """Open a window after global model ``params`` (M_0, or the last closing round)."""
        self._prev = self.scorer.view(params)
        self._start_loss = self._prev.loss
        self._buffer, self._losses = [], []

    def observe(
        self,
        round_: int,
        global_after: torch.Tensor,
        aggregate: torch.Tensor,
        updates: Callable[[], Updates],
        *,
        final: bool = False,
    ) -> dict[int, tuple[int, ...]] | None:
        """Buffer round ``round_``; return ``{round: kept client ids}`` when its window ends.

        Args:
            round_: The round (1-based) that produced ``global_after``.
            global_after: M_round.
            aggregate: The round's aggregate delta (M_round - M_{round-1}).
            updates: Returns the round's accepted deltas (called only if the round is kept).
            final: The last training round: flush the window even if it is not closed.
        """
        if self._prev is None:
            raise ConfigError("WindowSelector.start(M_0) must be called before observe()")
        view = self.scorer.view(global_after)
        score = self.scorer.divergence(self._prev, view)
        self._prev = view
        self._buffer.append(_Buffered(round_, score, aggregate, updates))
        self._losses.append(view.loss)
        closed = view.loss <= (1 - self.alpha) * self._start_loss or (
            self.max_window is not None and len(self._buffer) >= self.max_window
        )
        if not (closed or final):
            return None
        kept_rounds = select_rounds(
            {b.round: b.score for b in self._buffer}, self.round_ratio, self.rounding
        )
        by_round = {b.round: b for b in self._buffer}
        kept = {
            t: tuple(
                select_clients(by_round[t].updates(), by_round[t].aggregate, self.client_ratio)
            )
            for t in kept_rounds
        }
        self.windows.append(
            WindowRecord(
                rounds=tuple(b.round for b in self._buffer),
                scores=tuple(b.score for b in self._buffer),
                losses=tuple(self._losses),
                closed=closed,
                kept=kept,
            )
        )
        self._buffer, self._losses = [], []
        self._start_loss = view.loss if closed else self._start_loss
        return kept


class CrabPolicy:
    """Live recording policy ``crab``: writes only the selected updates, at window close.

    Every round's global model and aggregate are still committed each round (all methods and
    ``train --resume`` need them); the updates of a window's kept rounds are attached, in the
    same transaction, to the round that closes the window (``HistoryStore.write_round(...,
    attach=...)``), so nothing outside the selection is ever written. The open window lives in
    memory only: ``resume_round`` finds the last window closed in the store (recomputing F on R
    of the stored global models), and training restarts after it; with the seeded engine the
    re-run rounds are bit-identical, so a resumed run equals an uninterrupted one.

    Args:
        scorer: Loss and divergence on R.
        alpha: α.
        round_ratio: λ.
        client_ratio: δ.
        final_round: The run's last round T (the partial window is flushed there).
        rounding: P_b rounding.
        max_window: Optional window length cap.
        first_round: The round the first window opens after (0; a ``--continue``'s start).
    """

    name = "crab"

    def __init__(
        self,
        scorer: ReferenceScorer,
        *,
        alpha: float,
        round_ratio: float,
        client_ratio: float,
        final_round: int,
        rounding: str = "half_up",
        max_window: int | None = None,
        first_round: int = 0,
    ) -> None:
        self.selector = WindowSelector(
            scorer, alpha, round_ratio, client_ratio, rounding, max_window
        )
        self.final_round = final_round
        self.first_round = first_round
        self._buffer: dict[int, Updates] = {}

    def resume_round(self, store: HistoryStore) -> int:
        """Return the round training continues after, and set the window state to it.

        That is the last committed round if training is complete or no window is open, else
        the round that closed the last window (``first_round`` if none closed since it): the
        caller truncates the store after it and re-runs the open window's rounds. A
        continuation's windows open at its start round: the earlier rounds' last window was
        flushed when they ended (at their T).
        """
        last = store.last_round() or 0
        if last >= self.final_round:
            return last
        first = self.first_round
        losses = [self.selector.scorer.loss(store.read_model(t)) for t in range(first, last + 1)]
        closes = close_windows(losses, self.selector.alpha, self.selector.max_window)
        start = first + closes[-1] if closes else first
        self.selector.start(store.read_model(start))
        self._buffer = {}
        return start

    def select(self, record: RoundRecord) -> dict[int, dict[int, torch.Tensor]]:
        """Buffer a finished round; return ``{round: {client: delta}}`` to commit with it."""
        self._buffer[record.round] = {u.client_id: u.delta for u in record.updates}
        kept = self.selector.observe(
            record.round,
            record.global_after,
            record.aggregate,
            # the round's updates, read when the selector keeps them (r bound now)
            lambda r=record.round: self._buffer[r],  # type: ignore[misc]  # mypy: default args
            final=record.round >= self.final_round,
        )
        if kept is None:
            return {}
        out = {t: {c: self._buffer[t][c] for c in ids} for t, ids in kept.items()}
        self._buffer = {}
        return out


def build_crab_policy(history: HistoryConfig, env: PolicyEnv) -> CrabPolicy:
    """Return the live policy of ``history.policy: crab`` with the ``history.crab`` options."""
    opts = crab_options(history)
    reference = env.reference_set(opts.reference_size)
    return CrabPolicy(
        ReferenceScorer(env.model, reference.x, reference.y, opts.divergence),
        alpha=opts.alpha,
        round_ratio=opts.round_ratio,
        client_ratio=opts.client_ratio,
        final_round=env.final_round,
        rounding=opts.rounding,
        max_window=opts.max_window,
        first_round=env.first_round,
    )


#: ``history.policy: crab``, declared by the ``crab`` plugin (``fedunlearn.unlearn.crab.plugin``).
POLICY = register_policy(PolicySpec("crab", build_crab_policy, CrabSelectionConfig))
