"""Crab: recovery from poisoning with selective storage, rollback, calibrated replay.

Steps, in the order ``Crab._run`` calls them:

1. ``selection``: the stored rounds t_1 < ... < t_T' and their kept clients K_j (Sec. IV-B1). On
   a run recorded with ``history.policy: crab`` they are what the store holds; on a run
   recorded with ``all`` they are derived with the same ``WindowSelector`` the live policy uses
   (identical selection, tested), with the run's ``history.crab`` options or the overrides here.
2. ``rollback``: Stage II (Sec. IV-B2), the rollback index j* by ``params.rollback``:
   ``participation`` (default, exact), ``bounded`` (Eqs. 4-6 over every round, heuristic) or
   ``paper`` (Eqs. 3-6 as printed); see :mod:`fedunlearn.unlearn.crab.rollback`. j* is capped at
   T' - 1 so at least one stored round is replayed [CB8].
3. Recovery, Stage III (Sec. IV-B3): from Mbar_{j*} = M_{t_{j*}}, replay the stored rounds after
   j* with their stored clients K_j minus C_u: fresh local training, each delta rescaled to the
   norm of the client's stored delta (whole vector, or per tensor), aggregated (Eqs. 7-10), through
   :func:`fedunlearn.unlearn.replay.calibrated_replay` [CB9, CB14].
4. Final tuning [CB13]: FedAvg rounds of the remaining clients (the run's participation), as many
   as the replay skipped after the rollback point, within ``epoch_budget`` x Retrain's client
   epochs (``final_rounds: auto``), or a fixed count.
5. ``bounds`` (with ``bound_check``): Theorem 1 (Sec. IV-C), B_safe and the triangle inequality
   for the replay, against a retrain from the rollback model [CB15].

The result says where it stands: ``details.rollback_free_of_forgotten`` (the rollback model
never saw an update of C_u) and ``details.warnings`` (``code: message`` strings) when it did.

Paper: Jiang, Shen, Liu, Tan, Lam, "Towards Efficient and Certified Recovery from Poisoning
Attacks in Federated Learning", arXiv:2401.08216v2, Alg. 2, Eqs. 3-10, Theorem 1. Design
notes and every deviation ([Dn]): docs/methods/crab.md.

Deviations:
    [CB9] Rollback to Mbar_{j*} = M_{t_{j*}} (it already holds round t_{j*}'s updates) and
        replay stored rounds j*+1..T' (T' - j* rounds); Alg. 2 line 26 and Eq. 8 index these
        inconsistently. Recovery uses the run's local training (E epochs, η, batch) and the
        run's seeds of round t_k.
    [CB13] Final tuning is not in the paper; ``final_rounds: 0`` gives the paper's recovery.

Trajectory (docs/lifecycle.md): rounds 1..t_{j*} of the run as stored, the replayed rounds
(calibrated updates, marked estimated; a replayed round with no remaining client is left out),
then the final tuning rounds (fresh updates). None when the rollback model was trained with C_u
(``rollback_includes_forgotten``): no history without C_u leads to that result.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from fedunlearn.errors import ConfigError, UnsupportedHistoryError
from fedunlearn.unlearn.base import Details, RunOutput, UnlearnRequest
from fedunlearn.unlearn.context import UnlearnContext
from fedunlearn.unlearn.crab.bound import theorem1_bounds
from fedunlearn.unlearn.crab.params import CrabParams, crab_options
from fedunlearn.unlearn.crab.policy import ReferenceScorer, WindowRecord, WindowSelector
from fedunlearn.unlearn.crab.rollback import (
    first_participation,
    forgotten_influence_bound,
    influence,
    participation_index,
    require_scalars,
    rollback_index,
    unstored_participation,
    weighted_mean,
)
from fedunlearn.unlearn.receipt import BoundReport
from fedunlearn.unlearn.registry import register
from fedunlearn.unlearn.replay import calibrated_replay
from fedunlearn.unlearn.selection import SelectiveReplay, StoredRound
from fedunlearn.unlearn.trajectory_log import TrajectoryLog
from fedunlearn.unlearn.tuning import final_round_count, final_tuning

log = logging.getLogger(__name__)

# Machine-readable warning codes (the text before ": " in ``CrabDetails.warnings``).
WARN_INCLUDES_FORGOTTEN = "rollback_includes_forgotten"
WARN_UNSTORED_PARTICIPATION = "rollback_after_unstored_participation"


@dataclass(frozen=True)
class Rollback:
    """Stage II outcome.

    Attributes:
        mode: ``participation``, ``bounded`` or ``paper``.
        first_forgotten_round: First round a client of C_u was aggregated in (None: never).
        sensitivity: Per stored round, the S(C_u, j) term (S-based modes; else empty).
        influence: Per stored round, ||I_k(K_k^-)|| (the Φ terms; S-based modes).
        cumulative_sensitivity: S(C_u, j).
        threshold: Φ(j).
        index: j* after the ablation flag and the cap (0 = M_0).
        uncapped_index: j* by the rule.
        capped: Whether the cap at T' - 1 applied.
        round_bounds: ``bounded``: FL round -> the bound on the forgotten clients' influence.
    """

    mode: str
    first_forgotten_round: int | None
    sensitivity: tuple[float, ...]
    influence: tuple[float, ...]
    cumulative_sensitivity: tuple[float, ...]
    threshold: tuple[float, ...]
    index: int
    uncapped_index: int
    capped: bool
    round_bounds: dict[int, float]


@dataclass(frozen=True)
class CrabDetails(Details):
    """What ``crab`` did (JSON keys of round-indexed maps are strings).

    Attributes:
        timing: Seconds of selection, rollback, replay and final tuning.
        selection_options: The effective α, λ, δ.
        selection_source: ``crab`` (stored live) or ``all`` (derived).
        selection_cached: Whether the derived selection was read from the run directory, where
            an earlier request on the same history kept it (``unlearn.derived_cache``).
        stored_rounds: t_1 < ... < t_T' (rounds with kept client updates).
        stored_clients: Round -> kept clients K_j.
        num_stored_rounds: T'.
        stored_malicious: Round -> clients of C_u among the kept ones (rounds that have any).
        rollback: The Stage II rule (``participation``, ``bounded``, ``paper``).
        first_forgotten_round: First round in which a client of C_u was aggregated (None:
            never).
        rollback_free_of_forgotten: Whether the rollback model precedes that round, i.e. never
            saw an update of C_u.
        warnings: ``code: message`` strings; codes ``rollback_includes_forgotten`` (the
            rollback model was trained with C_u) and ``rollback_after_unstored_participation``
            (C_u took part unstored in rounds before it, which Eq. 4 cannot see).
        sensitivity: S terms per stored round (S-based modes; empty for ``participation``).
        benign_influence: ||I_k(K_k^-)|| per stored round (Φ terms, Eq. 5).
        cumulative_sensitivity: S(C_u, j), cumulative.
        threshold: Φ(j) = β Σ_{k<=j} ||I_k||.
        round_bounds: ``bounded``: FL round -> bound on ||G_t - G_t^-|| (rounds with C_u).
        rollback_index: j* (0 = M_0).
        rollback_index_uncapped: j* before the cap at T' - 1.
        rollback_capped: Whether the cap applied.
        rollback_round: t_{j*}, the round whose model recovery starts from.
        rule: The j* rule of the S-based modes (``prefix`` or ``literal``).
        no_rollback: The ablation flag.
        recovery_rounds: The replayed stored rounds.
        participants: Round -> replayed clients (K_j minus C_u).
        final_rounds: FedAvg rounds run after the replay [CB13].
        windows: The selection windows (rounds, closed, kept) when derived from an ``all`` run.
        windows_closed: How many of those closed on the loss criterion.
        bounds: Theorem 1 report of the replay (``bound_check``), else None.
    """

    timing: dict[str, float] = field(compare=False)  # wall seconds: not part of the result
    selection_options: dict[str, Any]
    selection_source: str
    selection_cached: bool = field(compare=False)  # how, not what: the same selection
    stored_rounds: tuple[int, ...]
    stored_clients: dict[str, list[int]]
    num_stored_rounds: int
    stored_malicious: dict[str, list[int]]
    rollback: str
    first_forgotten_round: int | None
    rollback_free_of_forgotten: bool
    warnings: tuple[str, ...]
    sensitivity: tuple[float, ...]
    benign_influence: tuple[float, ...]
    cumulative_sensitivity: tuple[float, ...]
    threshold: tuple[float, ...]
    round_bounds: dict[str, float]
    rollback_index: int
    rollback_index_uncapped: int
    rollback_capped: bool
    rollback_round: int
    rule: str
    no_rollback: bool
    recovery_rounds: tuple[int, ...]
    participants: dict[str, list[int]]
    final_rounds: int = 0
    windows: tuple[dict[str, Any], ...] = ()
    windows_closed: int = 0
    bounds: dict[str, Any] | None = None

    def certified_bound(self) -> BoundReport | None:
        """Theorem 1's B_safe at the last replayed round, with the distance measured there.

        Only with ``bound_check`` (it runs a Retrain from the rollback point to measure against);
        the bound covers the replay, not the final tuning rounds after it.
        """
        if not self.bounds or not self.bounds.get("rows"):
            return None
        last = self.bounds["rows"][-1]
        note = (
            "Theorem 1 assumes an L-smooth loss with bounded gradients; L and G are estimated "
            "along the retrain, so on a non-convex model the bound is illustrative"
        )
        if self.final_rounds:
            note += f"; it covers the replay, not the {self.final_rounds} final tuning round(s)"
        return BoundReport(
            name="Crab Theorem 1 (B_safe)",
            bound=float(last["safe"]),
            observed=float(last["observed"]),
            reference=f"retrain from the rollback point, round {last['tau']}",
            note=note,
        )


def _spans(rounds: list[int]) -> str:
    """Return sorted rounds as ``1-4, 7, 9-10``."""
    parts: list[str] = []
    for t in rounds:
        if parts and int(parts[-1].split("-")[-1]) == t - 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{t}"
        else:
            parts.append(str(t))
    return ", ".join(parts)


@register("crab")
class Crab(SelectiveReplay[CrabParams]):
    """Selective storage, rollback, calibrated replay of the stored benign updates, final tuning."""

    serves_generations = True  # an applied trajectory (docs/lifecycle.md)
    params_type = CrabParams
    required_policies = frozenset({"all", "crab"})

    policy = "crab"
    overrides = ("alpha", "round_ratio", "client_ratio")
    log_type = WindowRecord

    # ----- step 1: the selection ----------------------------------------------------------

    @staticmethod
    def _reference_scorer(context: UnlearnContext) -> ReferenceScorer:
        """F and the round divergence on the run's reference set R (its ``history.crab`` size)."""
        run = crab_options(context.recording)
        ref = context.reference_set(run.reference_size)
        return ReferenceScorer(context.clients.model, ref.x, ref.y, run.divergence)

    def check_history(self, context: UnlearnContext) -> None:
        """Also refuse ``bounded`` off FedAvg, or on a run without the per-client scalars."""
        super().check_history(context)
        if self.params.rollback == "bounded":
            if context.training.aggregator != "fedavg":
                raise ConfigError(
                    "crab rollback 'bounded' bounds the forgotten clients' influence on a FedAvg "
                    f"aggregate; this run aggregated with '{context.training.aggregator}'. Use "
                    "rollback=participation."
                )
            # a run recorded before the per-client scalars existed fails here, before any work
            require_scalars(context.history.client_records(1))

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
        run = crab_options(context.recording)
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

    def _stored_terms(
        self, context: UnlearnContext, stored: list[StoredRound], forget: frozenset[int]
    ) -> tuple[list[float], list[float], dict[int, float]]:
        """Per stored round: Eq. 4's term, ||I_k(K_k^-)|| (Eq. 5), and ||m_u|| when exact."""
        sizes = {c: context.clients.num_samples(c) for s in stored for c in s.clients}
        previous = torch.zeros(context.clients.num_params, dtype=torch.float64)  # Gbar_0 [CB6]
        sens, infl, exact = [], [], {}
        for sr in stored:
            deltas = {c: context.history.read_update(sr.round, c) for c in sr.clients}
            members = set(sr.clients)
            benign = members - forget
            n_all = sum(sizes[c] for c in members)
            norm = n_all if self.params.influence_weights == "all" else None
            i_benign = influence(deltas, sizes, benign, previous, norm)
            gone = members & forget
            if gone:
                # Eq. 4 term; 0 exactly when no forgotten client was stored (the paper's remark)
                sens.append(float((influence(deltas, sizes, members, previous) - i_benign).norm()))
                exact[sr.round] = float(weighted_mean({c: deltas[c] for c in gone}, sizes).norm())
            else:
                sens.append(0.0)
            infl.append(float(i_benign.norm()))
            previous = weighted_mean(deltas, sizes)  # Gbar_j [CB6]
        return sens, infl, exact

    def _bounded_terms(
        self,
        context: UnlearnContext,
        stored: list[StoredRound],
        forget: frozenset[int],
        exact: dict[int, float],
    ) -> tuple[list[float], dict[int, float]]:
        """[CB11] Per stored round j: Σ over FL rounds t_{j-1} < t <= t_j of the influence bound."""
        bounds: dict[int, float] = {}
        terms, previous_round = [], 0
        for sr in stored:
            term = 0.0
            for t in range(previous_round + 1, sr.round + 1):
                records = context.history.client_records(t)
                gone = {r.client_id for r in records if r.status == "accepted"} & forget
                if not gone:
                    continue
                stored_gone = {r.client_id for r in records if r.stored} & gone
                known = exact.get(t) if stored_gone == gone else None
                bounds[t] = forgotten_influence_bound(records, forget, known)
                term += bounds[t]
            terms.append(term)
            previous_round = sr.round
        return terms, bounds

    def rollback(
        self, context: UnlearnContext, stored: list[StoredRound], forget: frozenset[int]
    ) -> Rollback:
        """Stage II: j* by ``params.rollback`` (and the S and Φ curves of the S-based modes)."""
        mode = self.params.rollback
        first = first_participation(context.history, context.num_rounds, forget)
        sens: list[float] = []
        infl: list[float] = []
        cum_s: list[float] = []
        phi: list[float] = []
        bounds: dict[int, float] = {}
        if mode == "participation":
            index = participation_index([s.round for s in stored], first)
        else:
            sens, infl, exact = self._stored_terms(context, stored, forget)
            if mode == "bounded":
                sens, bounds = self._bounded_terms(context, stored, forget, exact)
            index, cum_s, phi = rollback_index(sens, infl, self.params.beta, self.params.rule)
        uncapped = index
        if self.params.no_rollback:
            index = 0
        capped = index > len(stored) - 1
        index = min(index, len(stored) - 1)  # [CB8] replay at least one stored round
        return Rollback(
            mode,
            first,
            tuple(sens),
            tuple(infl),
            tuple(cum_s),
            tuple(phi),
            index,
            uncapped,
            capped,
            bounds,
        )

    @staticmethod
    def _warnings(
        context: UnlearnContext, rb: Rollback, t_star: int, forget: frozenset[int]
    ) -> list[str]:
        """``code: message`` strings when the rollback model was trained with C_u."""
        first = rb.first_forgotten_round
        if first is None or t_star < first:
            return []
        out = [
            f"{WARN_INCLUDES_FORGOTTEN}: the rollback model M_{t_star} was trained with updates "
            f"of forgotten clients (first aggregated in round {first}); recovery from it does "
            "not remove them exactly (rollback=participation does)"
        ]
        unstored = unstored_participation(context.history, t_star, forget)
        if unstored:
            rounds = sorted(unstored)
            clients = sorted({c for ids in unstored.values() for c in ids})
            out.append(
                f"{WARN_UNSTORED_PARTICIPATION}: forgotten client(s) {clients} were aggregated "
                f"without their updates being stored in {len(rounds)} round(s) up to "
                f"t_j* = {t_star} (rounds {_spans(rounds)}); S(C_u, j) (Eq. 4, rollback={rb.mode}) "
                "does not count them"
                + (" and only bounds them heuristically" if rb.mode == "bounded" else "")
            )
        return out

    # ----- step 4: final tuning ---------------------------------------------------------------

    def final_round_count(
        self, context: UnlearnContext, t_star: int, replay_sizes: list[int]
    ) -> int:
        """[CB13] Return the final tuning rounds: ``final_rounds``, or ``auto``'s count.

        ``auto``: the FL rounds after the rollback point the replay did not cover (unstored
        rounds and stored rounds without a remaining client), at most as many as keep Crab's
        client epochs within ``epoch_budget`` x Retrain's (the original participants of every round
        minus the forgotten clients).

        Args:
            context: The unlearning context.
            t_star: t_{j*}.
            replay_sizes: Participants of each replayed stored round.
        """
        return final_round_count(  # the shared rule (fedunlearn.unlearn.tuning)
            context,
            self.params.final_rounds,
            self.params.epoch_budget,
            start_round=t_star,
            replay_sizes=replay_sizes,
        )

    # ----- the whole method -------------------------------------------------------------------

    def _run(self, request: UnlearnRequest, context: UnlearnContext) -> RunOutput:
        clock = time.perf_counter()
        windows: list[WindowRecord] = []
        selected = self.replay_selection(context, windows)
        stored = selected.stored
        selection_seconds = time.perf_counter() - clock
        forget = request.forget
        rb = self.rollback(context, stored, forget)
        rollback_seconds = time.perf_counter() - clock - selection_seconds
        j_star = rb.index
        t_star = stored[j_star - 1].round if j_star else 0
        warnings = self._warnings(context, rb, t_star, forget)
        for text in warnings:
            log.warning("crab: %s", text)
        log.info(
            "crab rollback (%s): t_j=%s S=%s Phi=%s j*=%d (round %d, uncapped %d%s)",
            rb.mode,
            [s.round for s in stored],
            [round(x, 4) for x in rb.cumulative_sensitivity],
            [round(x, 4) for x in rb.threshold],
            j_star,
            t_star,
            rb.uncapped_index,
            ", capped" if rb.capped else "",
        )
        start = context.start_from(t_star)
        # the new history: rounds 1..t* as they are (only when C_u took no part in them),
        # then the replayed rounds (calibrated: estimated), then the final tuning rounds
        first = rb.first_forgotten_round
        trajectory = TrajectoryLog(context) if first is None or t_star < first else None
        if trajectory is not None:
            for t in range(1, t_star + 1):
                trajectory.add_stored(t, forget)
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
            trajectory=trajectory,
        )
        replay_seconds = time.perf_counter() - clock - selection_seconds - rollback_seconds
        final = self.final_round_count(context, t_star, [len(p) for p in participants.values()])
        if final:
            # new rounds T+1..T+F: fresh seeds, the run's participation and aggregation rule
            params, tuned = final_tuning(context, params, final, trajectory)
            rows = [*rows, *tuned]
        timing = {
            "selection_seconds": selection_seconds,
            "rollback_seconds": rollback_seconds,
            "replay_seconds": replay_seconds,
            "final_seconds": time.perf_counter()
            - clock
            - selection_seconds
            - rollback_seconds
            - replay_seconds,
        }
        details = CrabDetails(
            timing=timing,
            selection_options=self.selection_options(context),
            selection_source=context.history.policy,
            selection_cached=selected.cached,
            stored_rounds=tuple(s.round for s in stored),
            stored_clients={str(s.round): list(s.clients) for s in stored},
            num_stored_rounds=len(stored),
            stored_malicious={
                str(s.round): sorted(set(s.clients) & forget)
                for s in stored
                if set(s.clients) & forget
            },
            rollback=rb.mode,
            first_forgotten_round=first,
            rollback_free_of_forgotten=first is None or t_star < first,
            warnings=tuple(warnings),
            sensitivity=rb.sensitivity,
            benign_influence=rb.influence,
            cumulative_sensitivity=rb.cumulative_sensitivity,
            threshold=rb.threshold,
            round_bounds={str(t): b for t, b in rb.round_bounds.items()},
            rollback_index=j_star,
            rollback_index_uncapped=rb.uncapped_index,
            rollback_capped=rb.capped,
            rollback_round=t_star,
            rule=self.params.rule,
            no_rollback=self.params.no_rollback,
            recovery_rounds=tuple(s.round for s in replay),
            participants={str(t): ids for t, ids in participants.items()},
            final_rounds=final,
            windows=tuple(
                {"rounds": list(w.rounds), "closed": w.closed, "kept": sorted(w.kept)}
                for w in windows
            ),
            windows_closed=sum(w.closed for w in windows),
            bounds=None
            if trace is None
            else theorem1_bounds(context, start, trace, len(stored) - j_star),
        )
        return RunOutput(
            params,
            rows,
            details,
            None if trajectory is None else trajectory.trajectory(forget),
        )
