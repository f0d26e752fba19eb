"""FedADP's dual-layer selective storage: loss stages, lowest-cosine rounds, top-γ updates.

Training is cut into stages: a stage ends when the server loss falls to (1 - β) times its value
at the end of the previous stage. At each stage end the server keeps the λ-share of the stage's
rounds whose global model changed most, i.e. the lowest d_t = ReLU(cos(M_t, M_{t-1})) (Eq. 7-8,
float64), and, for each kept round, the γ-share of client updates most aligned with the round's
aggregate, cos(g~_t^c, G_t) (Eq. 9). The last, partial stage is flushed at the end of training.

``StageSelector`` is the one implementation. The live recording policy (:class:`FedADPPolicy`,
``history.policy: fedadp``) feeds it each finished round; the ``fedadp`` unlearning method feeds
it the stored rounds of a run recorded with ``all`` (same tensors, same selection).

Paper: Jiang, Tong, Liu, Ye, Tan, Lam, "Efficient Federated Unlearning with Adaptive Differential
Privacy Preservation" (FedADP), Sec. IV-B2, Alg. 1 lines 14-24 and Eq. 7-9. Design note and
the deviation tags below: docs/methods/fedadp.md.

Deviations:
    [REC] The trigger is L(M_t) <= (1 - β) prev_loss with prev_loss = L(M_0), updated at every
        flush (AD6). The loss is the round metric ``clients_loss`` (AD3), given by the
        caller.
    [REC] Counts: k = max(1, floor(λ n + 0.5)) rounds per stage of n rounds and
        C' = max(1, floor(γ C + 0.5)) updates per kept round (AD7; a 1e-9 guard makes
        0.7 * 20 = 14). Ties: earlier round first, lower client id first.
    [REC] Round r (M_{r-1} -> M_r) is scored by d_r = ReLU(cos(M_r, M_{r-1})) and pairs with its
        own updates (AD13). ``model_align="updates"`` scores ReLU(cos(G_r, G_{r-1}));
        round 1 (no G_0) scores 0 there.
    [REC] Layer 2 does not depend on layer 1, so each round's top-γ updates are chosen when the
        round ends and only those are buffered (γ of the memory of buffering all; AD17).
    [REC] ``selection_mode="global"`` never triggers a stage: one flush at the end of training
        keeps max(1, round_half_up(λ T)) rounds (memory: T γ C updates until then; AD7).
    [REC] Every round's global model is kept by the store anyway (all methods and ``train
        --resume`` need it); the stored *update* fraction is what the selection controls (AD18).
    [REC] The similarity scores d and s are not stored (they are in the policy's ``stages``
        log); ε_t and n_c are (round scalars and client records; AD18).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import torch

from fedunlearn.errors import ConfigError, HistoryError
from fedunlearn.fl.metrics import CLIENTS_LOSS_KEY
from fedunlearn.fl.records import RoundRecord
from fedunlearn.history.policy import PolicyEnv, PolicySpec, register_policy
from fedunlearn.history.store import HistoryStore
from fedunlearn.unlearn.fedadp.params import FedADPSelectionConfig, fedadp_options
from fedunlearn.unlearn.selection import count_half_up, top_clients

if TYPE_CHECKING:
    from fedunlearn.config import HistoryConfig

LOSS_KEY = CLIENTS_LOSS_KEY

Updates = Mapping[int, torch.Tensor]
Transform = Callable[[int, int, torch.Tensor], torch.Tensor]


def relu_cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Return ReLU(cos(a, b)) in float64 (Eq. 7-8); 0 if either vector is zero."""
    x, y = a.to(torch.float64), b.to(torch.float64)
    denom = float(x.norm()) * float(y.norm())
    return max(0.0, float(x @ y) / denom) if denom > 0 else 0.0


def select_rounds(scores: Mapping[int, float], ratio: float) -> list[int]:
    """Return the k rounds with the smallest d, ascending (ties: earlier round first)."""
    if not scores:
        return []
    ranked = sorted(scores, key=lambda t: (scores[t], t))
    return sorted(ranked[: count_half_up(len(scores), ratio)])


def select_clients(updates: Updates, aggregate: torch.Tensor, ratio: float) -> list[int]:
    """Return the C' clients with the largest cos(g~, G) (Eq. 9), ascending (ties: lower id)."""
    return top_clients(updates, aggregate, count_half_up(len(updates), ratio))


def stage_closes(loss: float, prev_loss: float, beta: float) -> bool:
    """Return whether a round with server loss ``loss`` ends the open stage (Alg. 1's trigger).

    ``prev_loss`` is L(M_0) for the first stage and the loss at the previous stage end after
    it: the caller resets it at every flush (docs/methods/fedadp.md, [REC] stage trigger).
    """
    return loss <= (1 - beta) * prev_loss


def stage_ends(losses: list[float], beta: float) -> list[int]:
    """Return the rounds that end a stage, given ``losses[t] = L(M_t)`` for t = 0..T."""
    ends: list[int] = []
    prev = losses[0] if losses else 0.0
    for t in range(1, len(losses)):
        if stage_closes(losses[t], prev, beta):
            ends.append(t)
            prev = losses[t]
    return ends


@dataclass(frozen=True)
class Stage:
    """One stage: its rounds and scores, whether the trigger closed it, the kept selection."""

    rounds: tuple[int, ...]
    scores: tuple[float, ...]
    closed: bool
    kept: Mapping[int, tuple[int, ...]]


@dataclass
class _Buffered:
    round: int
    score: float
    clients: tuple[int, ...]
    updates: dict[int, torch.Tensor]


@dataclass
class StageSelector:
    """Online dual-layer selection: feed finished rounds in order, get the kept ones per stage.

    Args:
        beta: β.
        round_ratio: λ.
        client_ratio: γ.
        model_align: ``params`` (Eq. 7) or ``updates``.
        selection_mode: ``staged`` or ``global``.
        total_rounds: T (``global`` keeps round_half_up(λ T) rounds).
    """

    beta: float
    round_ratio: float
    client_ratio: float
    model_align: str = "params"
    selection_mode: str = "staged"
    total_rounds: int | None = None
    stages: list[Stage] = field(default_factory=list)
    _prev_loss: float | None = None
    _prev_aggregate: torch.Tensor | None = None
    _buffer: list[_Buffered] = field(default_factory=list)
    _kept: dict[int, dict[int, torch.Tensor]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.model_align not in ("params", "updates"):
            raise ConfigError(
                f"model_align must be 'params' or 'updates'; got {self.model_align!r}"
            )
        if self.selection_mode not in ("staged", "global"):
            raise ConfigError(
                f"selection_mode must be 'staged' or 'global'; got {self.selection_mode!r}"
            )

    def start(self, loss: float, aggregate: torch.Tensor | None = None) -> None:
        """Open a stage after a model with server loss ``loss`` (M_0 or the last stage end)."""
        self._prev_loss = float(loss)
        self._prev_aggregate = aggregate
        self._buffer = []

    def observe(
        self,
        round_: int,
        global_before: torch.Tensor,
        global_after: torch.Tensor,
        aggregate: torch.Tensor,
        loss: float,
        updates: Updates,
        *,
        final: bool = False,
    ) -> dict[int, tuple[int, ...]] | None:
        """Buffer round ``round_``; return ``{round: kept client ids}`` when its stage ends.

        Args:
            round_: The round (1-based) that turned ``global_before`` into ``global_after``.
            global_before: M_{round-1}.
            global_after: M_round.
            aggregate: The round's applied aggregate G_round.
            loss: Server loss L(M_round).
            updates: The round's (noisy) client updates, as they would be stored.
            final: The last training round: flush the stage even if it is not closed.
        """
        if self._prev_loss is None:
            raise ConfigError("StageSelector.start(L(M_0)) must be called before observe()")
        if self.model_align == "params":
            score = relu_cosine(global_after, global_before)  # Eq. 7-8
        else:
            prev = self._prev_aggregate
            score = relu_cosine(aggregate, prev) if prev is not None else 0.0
        self._prev_aggregate = aggregate
        kept_clients = tuple(select_clients(updates, aggregate, self.client_ratio))  # Eq. 9
        self._buffer.append(
            _Buffered(round_, score, kept_clients, {c: updates[c] for c in kept_clients})
        )
        closed = self.selection_mode == "staged" and stage_closes(loss, self._prev_loss, self.beta)
        if not (closed or final):
            return None
        scores = {b.round: b.score for b in self._buffer}
        if self.selection_mode == "global":
            k = count_half_up(self.total_rounds or len(scores), self.round_ratio)
            kept_rounds = sorted(sorted(scores, key=lambda t: (scores[t], t))[:k])
        else:
            kept_rounds = select_rounds(scores, self.round_ratio)
        by_round = {b.round: b for b in self._buffer}
        kept = {t: by_round[t].clients for t in kept_rounds}
        self.stages.append(
            Stage(
                rounds=tuple(b.round for b in self._buffer),
                scores=tuple(b.score for b in self._buffer),
                closed=closed,
                kept=kept,
            )
        )
        self._kept = {t: by_round[t].updates for t in kept_rounds}
        self._buffer = []
        if closed:
            self._prev_loss = float(loss)
        return kept

    def kept_updates(self) -> dict[int, dict[int, torch.Tensor]]:
        """Return the buffered updates of the rounds kept at the last flush."""
        return dict(self._kept)


class FedADPPolicy:
    """Live recording policy ``fedadp``: writes only the selected (noisy) updates, at stage end.

    Every round's global model and aggregate are committed each round; the kept updates of a
    stage are attached to the round that ends it, in the same transaction. The open stage lives
    in memory only: ``resume_round`` finds the last stage end from the stored ``clients_loss``
    scalars and training restarts after it (the re-run rounds are bit-identical).

    Args:
        beta: β.
        round_ratio: λ.
        client_ratio: γ.
        final_round: T.
        model_align: ``params`` or ``updates``.
        selection_mode: ``staged`` or ``global``.
        store_transform: ``(round, client_id, delta) -> stored copy``; with ``dp_scope:
            store_only`` it adds the seeded DP noise to the clean upload (default: identity).
        first_round: The round the first stage opens after (0; a ``--continue``'s start).
        first_loss: L(M_{first_round}) as the continuation measures it (over the clients never
            forgotten); None: the stored round's.
    """

    name = "fedadp"

    def __init__(
        self,
        *,
        beta: float,
        round_ratio: float,
        client_ratio: float,
        final_round: int,
        model_align: str = "params",
        selection_mode: str = "staged",
        store_transform: Transform | None = None,
        first_round: int = 0,
        first_loss: float | None = None,
    ) -> None:
        self.first_loss = first_loss
        self.selector = StageSelector(
            beta,
            round_ratio,
            client_ratio,
            model_align,
            selection_mode,
            final_round - first_round,  # ``global``: λ of this session's rounds
        )
        self.final_round = final_round
        self.first_round = first_round
        self.store_transform = store_transform

    def resume_round(self, store: HistoryStore) -> int:
        """Return the round training continues after, and set the stage state to it.

        A continuation's first stage opens at its start round (``first_round``): the earlier
        rounds' last stage was flushed when they ended. Its loss is ``first_loss`` (the
        continuation's measure, over the clients never forgotten) when given.
        """
        last = store.last_round() or 0
        if last >= self.final_round:
            return last
        first = self.first_round
        losses = []
        for t in range(first, last + 1):
            if t == first and self.first_loss is not None:
                losses.append(self.first_loss)
                continue
            sc = store.round_scalars(t)
            if LOSS_KEY not in sc:
                raise HistoryError(
                    f"round {t} has no '{LOSS_KEY}' scalar; this run was not recorded with "
                    "history.policy=fedadp"
                )
            losses.append(float(cast(float, sc[LOSS_KEY])))
        ends = [first + e for e in stage_ends(losses, self.selector.beta)]
        start = ends[-1] if ends and self.selector.selection_mode == "staged" else first
        previous = (
            store.read_model(start, "aggregate")
            if start and (start, "aggregate") in store.stored_models()
            else None  # M_0, or a model an apply appended (no aggregate)
        )
        self.selector.start(losses[start - first], previous)
        return start

    def select(self, record: RoundRecord) -> dict[int, dict[int, torch.Tensor]]:
        """Buffer a finished round; return ``{round: {client: stored copy}}`` at a stage end."""
        if LOSS_KEY not in record.metrics:
            raise HistoryError(
                f"round {record.round} has no '{LOSS_KEY}' metric; build the run with "
                "fedunlearn.runs (it adds the server loss for history.policy=fedadp)"
            )
        updates = {u.client_id: u.delta for u in record.updates}
        if self.store_transform is not None:
            updates = {c: self.store_transform(record.round, c, d) for c, d in updates.items()}
        kept = self.selector.observe(
            record.round,
            record.global_before,
            record.global_after,
            record.aggregate,
            float(record.metrics[LOSS_KEY]),
            updates,
            final=record.round >= self.final_round,
        )
        if kept is None:
            return {}
        return self.selector.kept_updates()


def build_fedadp_policy(history: HistoryConfig, env: PolicyEnv) -> FedADPPolicy:
    """Return the live policy of ``history.policy: fedadp`` with the ``history.fedadp`` options."""
    opts = fedadp_options(history)
    return FedADPPolicy(
        beta=opts.beta,
        round_ratio=opts.round_ratio,
        client_ratio=opts.client_ratio,
        final_round=env.final_round,
        model_align=opts.model_align,
        selection_mode=opts.selection_mode,
        store_transform=env.store_transform,
        first_round=env.first_round,
        first_loss=env.first_scalars.get(LOSS_KEY),
    )


#: ``history.policy: fedadp``, declared by the ``fedadp`` plugin; it stores
#: ``env.store_transform`` of what it keeps (``privacy.dp_scope: store_only``).
POLICY = register_policy(
    PolicySpec(
        "fedadp",
        build_fedadp_policy,
        FedADPSelectionConfig,
        clients_loss_samples=lambda options: cast(FedADPSelectionConfig, options).loss_samples,
        applies_store_transform=True,
    )
)
