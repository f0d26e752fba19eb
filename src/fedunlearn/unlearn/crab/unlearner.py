"""Crab: recovery from poisoning with selective storage, adaptive rollback, calibrated replay.

Steps, in the order ``Crab._run`` calls them:

1. ``selection``: the stored rounds t_1 < ... < t_T' and their kept clients K_j. On a run
   recorded with ``history.policy: crab`` they are what the store holds; on a run recorded with
   ``all`` they are derived with the same ``WindowSelector`` the live policy uses (identical
   selection, tested), with the run's ``history.crab`` options or the overrides given here.
2. ``rollback``: Stage II. Influence (Eq. 3), cumulative sensitivity S (Eq. 4), threshold Φ
   (Eq. 5) and the rollback index j* (Eq. 6, literal or prefix rule, capped at T' - 1).
3. Recovery, Stage III: from Mbar_{j*} = M_{t_{j*}}, replay the stored rounds after j* with
   their stored benign clients K_j minus C_u: fresh local training, each delta rescaled to the norm
   of the client's stored delta (whole vector, or per tensor), FedAvg (Eqs. 7-10), through
   :func:`fedunlearn.unlearn.replay.calibrated_replay`.
4. ``bounds`` (with ``bound_check``): Theorem 1 (paper form), B_safe and the exact triangle
   inequality, next to the observed distance to a retrain started from the rollback model.

Paper: Jiang, Shen, Liu, Tan, Lam, "Towards Efficient and Certified Recovery from Poisoning
Attacks in Federated Learning", arXiv:2401.08216v2, Alg. 2, Eqs. 3-10, Theorem 1; Crab spec
§2.3-§3.

Deviations:
    [REC] Φ(j) = β Σ_{k<=j} ||I_k(K_k^-)|| (the paper sums vectors; spec A6); S and Φ are
        cumulative over stored rounds k <= j. I(K^-) is normalised by n_{K^-} (spec A7;
        ``influence_weights="all"`` uses n_K); I(∅) = 0; Gbar_0 = 0 (spec A8).
    [REC] Gbar_j, the kept clients' FedAvg aggregate, is recomputed from the stored deltas
        (it is not stored). Updates are handled as deltas Δ = -η g throughout: every quantity
        in Stage II is a ratio or a sum of norms, so the convention cancels (spec §1.1).
    [REC] No j satisfies S <= Φ: j* = 0 (roll back to M_0, always stored); j* is capped at
        T' - 1 so at least one recovery round runs (spec A9), and ``capped`` is logged.
        ``rule="prefix"``: the largest j for which every k <= j satisfies it.
    [REC] Stored rounds replay j*+1..T' (T' - j* rounds), pairing round t's updates with
        M_{t} (spec A4). Recovery uses the run's local training (E epochs, η, batch) and the
        run's seeds for round t_k; FedAvg weights n_c / n_P (Eq. 9).
    [REC] Bounds: one FL round is one step of size η along a pseudo-gradient -Δ/η (spec §3).
        G = the largest observed pseudo-gradient norm (stored, fresh, retrain steps), L = the
        largest finite-difference ratio ||H_{τ+1} - H_τ|| / ||M_{τ+1} - M_τ|| along the
        reference retrain, ΔF = F(Mtilde_0) on R (F* >= 0), τ_r = ceil(r T / (T' - j*)). The
        reference retrain (all remaining clients, T rounds from Mtilde_0, the run's seeds of
        rounds 1..T) is a diagnostic: its cost is reported in ``details`` and not in ``costs``.
    [FIX] The paper's final step sqrt(a) + sqrt(b) -> sqrt(a + b) is invalid (spec §3); both the
        paper form and B_safe = sqrt(a) + sqrt(b) are reported. Only the triangle inequality is
        a hard check (``triangle_holds``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from fedunlearn.errors import UnsupportedHistoryError
from fedunlearn.unlearn.base import Details, RunOutput, UnlearnRequest
from fedunlearn.unlearn.context import UnlearnContext
from fedunlearn.unlearn.crab.bound import theorem1_bounds
from fedunlearn.unlearn.crab.params import CrabParams
from fedunlearn.unlearn.crab.policy import ReferenceScorer, WindowRecord, WindowSelector
from fedunlearn.unlearn.registry import register
from fedunlearn.unlearn.replay import calibrated_replay
from fedunlearn.unlearn.selection import SelectiveReplay, StoredRound

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rollback:
    """Stage II outcome: per stored round S_k and Φ_k terms, cumulative curves and j*."""

    sensitivity: tuple[float, ...]
    influence: tuple[float, ...]
    cumulative_sensitivity: tuple[float, ...]
    threshold: tuple[float, ...]
    index: int  # j* (0 = M_0)
    uncapped_index: int
    capped: bool


def weighted_mean(deltas: dict[int, torch.Tensor], sizes: dict[int, int]) -> torch.Tensor:
    """Return Σ_c n_c / n_S Δ_c in float64 (a zero-length sum is an error)."""
    total = sum(sizes[c] for c in deltas)
    out = torch.zeros_like(next(iter(deltas.values())), dtype=torch.float64)
    for c in sorted(deltas):
        out += (sizes[c] / total) * deltas[c].to(torch.float64)
    return out


def influence(
    deltas: dict[int, torch.Tensor],
    sizes: dict[int, int],
    members: set[int],
    previous: torch.Tensor,
    normaliser: int | None = None,
) -> torch.Tensor:
    """Eq. 3: I(S) = Σ_{c∈S} n_c / n (Δ_c - Gbar_{j-1}); n = n_S unless given; I(∅) = 0."""
    if not members:
        return torch.zeros_like(previous)
    n = normaliser if normaliser is not None else sum(sizes[c] for c in members)
    out = torch.zeros_like(previous)
    for c in sorted(members):
        out += (sizes[c] / n) * (deltas[c].to(torch.float64) - previous)
    return out


def rollback_index(
    sensitivity: list[float],
    influence_norms: list[float],
    beta: float,
    rule: str = "literal",
) -> tuple[int, list[float], list[float]]:
    """Eqs. 4-6: return (j*, cumulative S, Φ); j* = 0 if no stored round qualifies."""
    cum_s, phi = [], []
    s = i = 0.0
    for sk, ik in zip(sensitivity, influence_norms, strict=True):
        s += sk
        i += ik
        cum_s.append(s)
        phi.append(beta * i)
    ok = [a <= b for a, b in zip(cum_s, phi, strict=True)]
    if rule == "prefix":
        j = 0
        while j < len(ok) and ok[j]:
            j += 1
        return j, cum_s, phi
    qualifying = [j + 1 for j, good in enumerate(ok) if good]
    return (qualifying[-1] if qualifying else 0), cum_s, phi


@dataclass(frozen=True)
class CrabDetails(Details):
    """What ``crab`` did (JSON keys of round-indexed maps are strings).

    Attributes:
        timing: Seconds of selection, rollback and replay.
        selection_options: The effective α, λ, δ.
        selection_source: ``crab`` (stored live) or ``all`` (derived).
        stored_rounds: t_1 < ... < t_T' (rounds with kept client updates).
        stored_clients: Round -> kept clients K_j.
        num_stored_rounds: T'.
        stored_malicious: Round -> clients of C_u among the kept ones (rounds that have any).
        sensitivity: S_k per stored round (Eq. 4 terms).
        benign_influence: ||I_k(K_k^-)|| per stored round (Φ terms, Eq. 5).
        cumulative_sensitivity: S(j), cumulative.
        threshold: Φ(j) = β Σ_{k<=j} ||I_k||.
        rollback_index: j* (0 = M_0).
        rollback_index_uncapped: j* before the cap at T' - 1.
        rollback_capped: Whether the cap applied.
        rollback_round: t_{j*}, the round whose model recovery starts from.
        rule: The j* rule (``literal`` or ``prefix``).
        no_rollback: The ablation flag.
        recovery_rounds: The replayed stored rounds.
        participants: Round -> replayed clients (K_j minus C_u).
        windows: The selection windows (rounds, closed, kept) when derived from an ``all`` run.
        windows_closed: How many of those closed on the loss criterion.
        bounds: Theorem 1 report (``bound_check``), else None.
    """

    timing: dict[str, float] = field(compare=False)  # wall seconds: not part of the result
    selection_options: dict[str, Any]
    selection_source: str
    stored_rounds: tuple[int, ...]
    stored_clients: dict[str, list[int]]
    num_stored_rounds: int
    stored_malicious: dict[str, list[int]]
    sensitivity: tuple[float, ...]
    benign_influence: tuple[float, ...]
    cumulative_sensitivity: tuple[float, ...]
    threshold: tuple[float, ...]
    rollback_index: int
    rollback_index_uncapped: int
    rollback_capped: bool
    rollback_round: int
    rule: str
    no_rollback: bool
    recovery_rounds: tuple[int, ...]
    participants: dict[str, list[int]]
    windows: tuple[dict[str, Any], ...] = ()
    windows_closed: int = 0
    bounds: dict[str, Any] | None = None


@register("crab")
class Crab(SelectiveReplay):
    """Selective storage, adaptive rollback and calibrated replay of the stored benign updates."""

    params_type = CrabParams
    required_policies = frozenset({"all", "crab"})

    policy = "crab"
    overrides = ("alpha", "round_ratio", "client_ratio")

    # ----- step 1: the selection ----------------------------------------------------------

    @staticmethod
    def _reference_scorer(context: UnlearnContext) -> ReferenceScorer:
        """F and the round divergence on the run's reference set R (its ``history.crab`` size)."""
        run = context.recording.options("crab")
        ref = context.reference_set(run.reference_size)
        return ReferenceScorer(context.clients.model, ref.x, ref.y, run.divergence)

    def check_derivable(self, context: UnlearnContext) -> None:
        """Deriving the selection of an ``all`` run needs the reference set R."""
        if not context.has_reference_set:
            raise UnsupportedHistoryError(
                "crab derives its selection from an 'all' run on the reference set R, and this "
                "context has none; open the run with UnlearnSession."
            )

    def derive_selection(self, context: UnlearnContext, log: list[Any]) -> list[StoredRound]:
        """Run the live policy's ``WindowSelector`` over an ``all`` run (log: its windows)."""
        history = context.history
        num_rounds = context.num_rounds
        opts = self.selection_options(context)
        run = context.recording.options("crab")
        selector = WindowSelector(
            self._reference_scorer(context),
            opts["alpha"],
            opts["round_ratio"],
            opts["client_ratio"],
            run.rounding,
            run.max_window,
        )
        selector.start(history.read_model(0))
        out = []
        for t in range(1, num_rounds + 1):

            def updates(t: int = t) -> dict[int, torch.Tensor]:
                return {
                    r.client_id: history.read_update(t, r.client_id)
                    for r in history.client_records(t)
                    if r.status == "accepted" and r.stored
                }

            kept = selector.observe(
                t,
                history.read_model(t),
                history.read_model(t, "aggregate"),
                updates,
                final=t == num_rounds,
            )
            out += [StoredRound(r, ids) for r, ids in sorted((kept or {}).items()) if ids]
        log.extend(selector.windows)
        return out

    # ----- step 2: rollback -----------------------------------------------------------------

    def rollback(
        self, context: UnlearnContext, stored: list[StoredRound], forget: frozenset[int]
    ) -> Rollback:
        """Stage II: S_k, ||I_k(K_k^-)||, cumulative curves and j* (literal/prefix, capped)."""
        sizes = {c: context.clients.num_samples(c) for s in stored for c in s.clients}
        previous = torch.zeros(context.clients.num_params, dtype=torch.float64)  # Gbar_0
        sens, infl = [], []
        for sr in stored:
            deltas = {c: context.history.read_update(sr.round, c) for c in sr.clients}
            members = set(sr.clients)
            benign = members - forget
            n_all = sum(sizes[c] for c in members)
            norm = n_all if self.params.influence_weights == "all" else None
            i_benign = influence(deltas, sizes, benign, previous, norm)
            if members & forget:
                # Eq. 4 term; 0 exactly when no malicious client was stored (the paper's remark)
                sens.append(float((influence(deltas, sizes, members, previous) - i_benign).norm()))
            else:
                sens.append(0.0)
            infl.append(float(i_benign.norm()))
            previous = weighted_mean(deltas, sizes)  # Gbar_j
        index, cum_s, phi = rollback_index(sens, infl, self.params.beta, self.params.rule)
        uncapped = index
        if self.params.no_rollback:
            index = 0
        capped = index > len(stored) - 1
        index = min(index, len(stored) - 1)
        return Rollback(tuple(sens), tuple(infl), tuple(cum_s), tuple(phi), index, uncapped, capped)

    # ----- step 3: recovery -----------------------------------------------------------------

    def _run(
        self, request: UnlearnRequest, context: UnlearnContext
    ) -> RunOutput:
        clock = time.perf_counter()
        windows: list[WindowRecord] = []
        stored = self.selection(context, windows)
        selection_seconds = time.perf_counter() - clock
        if not stored:
            raise UnsupportedHistoryError(
                "crab found no stored round with client updates in this run; record it with "
                "history.policy=crab or all."
            )
        forget = request.forget
        rb = self.rollback(context, stored, forget)
        rollback_seconds = time.perf_counter() - clock - selection_seconds
        j_star = rb.index
        t_star = stored[j_star - 1].round if j_star else 0
        log.info(
            "crab rollback: t_j=%s S=%s Phi=%s j*=%d (round %d, uncapped %d%s)",
            [s.round for s in stored],
            [round(x, 4) for x in rb.cumulative_sensitivity],
            [round(x, 4) for x in rb.threshold],
            j_star,
            t_star,
            rb.uncapped_index,
            ", capped" if rb.capped else "",
        )
        start = context.history.read_model(t_star)
        replay = stored[j_star:]
        participants = {s.round: [c for c in s.clients if c not in forget] for s in replay}
        trace: list[dict[str, Any]] | None = [] if self.params.bound_check else None
        params, rows = calibrated_replay(
            context,
            [s.round for s in replay],
            start_params=start,
            spec=context.clients.spec,
            scope=self.params.norm_scope,
            participants=participants,
            trace=trace,
        )
        timing = {
            "selection_seconds": selection_seconds,
            "rollback_seconds": rollback_seconds,
            "replay_seconds": time.perf_counter() - clock - selection_seconds - rollback_seconds,
        }
        details = CrabDetails(
            timing=timing,
            selection_options=self.selection_options(context),
            selection_source=context.history.policy,
            stored_rounds=tuple(s.round for s in stored),
            stored_clients={str(s.round): list(s.clients) for s in stored},
            num_stored_rounds=len(stored),
            stored_malicious={
                str(s.round): sorted(set(s.clients) & forget)
                for s in stored
                if set(s.clients) & forget
            },
            sensitivity=rb.sensitivity,
            benign_influence=rb.influence,
            cumulative_sensitivity=rb.cumulative_sensitivity,
            threshold=rb.threshold,
            rollback_index=j_star,
            rollback_index_uncapped=rb.uncapped_index,
            rollback_capped=rb.capped,
            rollback_round=t_star,
            rule=self.params.rule,
            no_rollback=self.params.no_rollback,
            recovery_rounds=tuple(s.round for s in replay),
            participants={str(t): ids for t, ids in participants.items()},
            windows=tuple(
                {"rounds": list(w.rounds), "closed": w.closed, "kept": sorted(w.kept)}
                for w in windows
            ),
            windows_closed=sum(w.closed for w in windows),
            bounds=None
            if trace is None
            else theorem1_bounds(context, start, trace, len(stored) - j_star),
        )
        return RunOutput(params, rows, details)
