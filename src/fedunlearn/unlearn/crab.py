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
import math
import time
from dataclasses import dataclass, fields
from typing import Any, Literal

import torch
from pydantic import Field

from fedunlearn.errors import ConfigError, UnsupportedHistoryError
from fedunlearn.fl.engine import run_rounds
from fedunlearn.fl.records import RoundRecord
from fedunlearn.history.crab import ReferenceScorer, WindowRecord, WindowSelector
from fedunlearn.unlearn.base import MethodParams, UnlearnContext, Unlearner, UnlearnRequest
from fedunlearn.unlearn.registry import register
from fedunlearn.unlearn.replay import (
    StoredRound,
    calibrated_replay,
    refuse_overrides_of_live_selection,
    selection_options,
)

log = logging.getLogger(__name__)


class CrabParams(MethodParams):
    """Crab hyperparameters (selection overrides apply only to runs recorded with ``all``)."""

    beta: float = Field(0.3, gt=0, description="β: sensitivity threshold ratio (Eq. 5)")
    rule: Literal["literal", "prefix"] = Field("literal", description="j* rule (Eq. 6)")
    influence_weights: Literal["benign", "all"] = Field(
        "benign", description="normalise I(K^-) by n_{K^-} (paper) or n_K (spec A7)"
    )
    no_rollback: bool = Field(False, description="ablation: j* = 0 (replay from M_0)")
    norm_scope: Literal["model", "layer"] = "model"
    alpha: float | None = Field(None, gt=0, lt=1, description="override history.crab.alpha")
    round_ratio: float | None = Field(None, gt=0, le=1, description="override λ")
    client_ratio: float | None = Field(None, gt=0, le=1, description="override δ")
    bound_check: bool = Field(False, description="retrain from Mtilde_0 and report the bounds")


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


@register("crab")
class Crab(Unlearner):
    """Selective storage, adaptive rollback and calibrated replay of the stored benign updates."""

    params_type = CrabParams
    required_policies = frozenset({"all", "crab"})

    def __init__(self, params: CrabParams | dict[str, Any] | None = None) -> None:
        super().__init__(params)
        self._cache: dict[str, list[StoredRound]] = {}

    # ----- step 1: the selection ----------------------------------------------------------

    def _options(self, context: UnlearnContext) -> dict[str, Any]:
        return selection_options(
            self.params, context.config.history.crab, ("alpha", "round_ratio", "client_ratio")
        )

    def check_history(self, context: UnlearnContext) -> None:
        """Also refuse selection overrides on a run whose selection was made live."""
        super().check_history(context)
        if context.history.policy == "crab":
            refuse_overrides_of_live_selection(
                "crab", "crab", self._options(context), context.config.history.crab
            )
        elif context.reference is None:
            raise UnsupportedHistoryError(
                "crab derives its selection from an 'all' run on the reference set R, and this "
                "context has none; open the run with UnlearnSession."
            )

    def selection(
        self, context: UnlearnContext, windows: list[WindowRecord] | None = None
    ) -> list[StoredRound]:
        """Return the stored rounds with their kept clients (stored, or derived from ``all``)."""
        history = context.history
        num_rounds = context.num_rounds
        if history.policy == "crab":
            out = []
            for t in range(1, num_rounds + 1):
                kept = tuple(
                    r.client_id
                    for r in history.client_records(t)
                    if r.status == "accepted" and r.stored
                )
                if kept:
                    out.append(StoredRound(t, kept))
            return out
        if context.reference is None:
            raise UnsupportedHistoryError("crab needs the run's reference set R (UnlearnSession)")
        opts = self._options(context)
        run = context.config.history.crab
        scorer = ReferenceScorer(
            context.clients.model, context.reference.x, context.reference.y, run.divergence
        )
        selector = WindowSelector(
            scorer,
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
        if windows is not None:
            windows.extend(selector.windows)
        return out

    def _cache_key(self, context: UnlearnContext) -> str:
        return context.config.model_dump_json() + context.history.policy

    def history_bytes_needed(self, context: UnlearnContext) -> int:
        """M_0, the global model of each stored round (rollback candidates), kept updates."""
        key = self._cache_key(context)
        if key not in self._cache:
            self._cache[key] = self.selection(context)
        stored = self._cache[key]
        d = context.clients.num_params
        return (1 + len(stored) + sum(len(s.clients) for s in stored)) * d * 4

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
    ) -> tuple[torch.Tensor, list[dict[str, float]], dict[str, Any]]:
        clock = time.perf_counter()
        windows: list[WindowRecord] = []
        stored = self.selection(context, windows)
        selection_seconds = time.perf_counter() - clock
        self._cache[self._cache_key(context)] = stored
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
        details: dict[str, Any] = {
            "timing": timing,
            "selection_options": self._options(context),
            "selection_source": context.history.policy,
            "stored_rounds": [s.round for s in stored],
            "stored_clients": {str(s.round): list(s.clients) for s in stored},
            "num_stored_rounds": len(stored),
            "stored_malicious": {
                str(s.round): sorted(set(s.clients) & forget)
                for s in stored
                if set(s.clients) & forget
            },
            "sensitivity": list(rb.sensitivity),
            "benign_influence": list(rb.influence),
            "cumulative_sensitivity": list(rb.cumulative_sensitivity),
            "threshold": list(rb.threshold),
            "rollback_index": j_star,
            "rollback_index_uncapped": rb.uncapped_index,
            "rollback_capped": rb.capped,
            "rollback_round": t_star,
            "rule": self.params.rule,
            "no_rollback": self.params.no_rollback,
            "recovery_rounds": [s.round for s in replay],
            "participants": {str(t): ids for t, ids in participants.items()},
        }
        if windows:
            details["windows"] = [
                {"rounds": list(w.rounds), "closed": w.closed, "kept": sorted(w.kept)}
                for w in windows
            ]
            details["windows_closed"] = sum(w.closed for w in windows)
        if trace is not None:
            details["bounds"] = self.bounds(context, start, trace, len(stored) - j_star)
        return params, rows, details

    # ----- step 4: bounds -------------------------------------------------------------------

    def bounds(
        self,
        context: UnlearnContext,
        start: torch.Tensor,
        trace: list[dict[str, Any]],
        num_replayed: int,
    ) -> dict[str, Any]:
        """Theorem 1, B_safe and the triangle bound against a retrain from ``start``."""
        if context.reference is None:
            raise ConfigError("bound_check needs the run's reference set R (UnlearnSession)")
        eta = context.clients.spec.lr
        total = context.num_rounds
        saved = {f.name: getattr(context.meter, f.name) for f in fields(context.meter)}
        trajectory = [start]

        class _Collect:
            def on_round_end(self, record: RoundRecord) -> None:
                trajectory.append(record.global_after)

        run_rounds(
            context.clients,
            context.aggregator,
            start,
            num_rounds=total,
            participation=context.config.training.participation,
            observers=[_Collect()],
        )
        reference_cost = {
            "client_epochs": context.meter.client_epochs - saved["client_epochs"],
            "rounds": total,
        }
        for name, value in saved.items():  # the reference run is a diagnostic, not a cost
            setattr(context.meter, name, value)
        steps = [trajectory[i + 1] - trajectory[i] for i in range(total)]
        step_norms = [float(s.norm()) for s in steps]
        # L: finite-difference ratio of consecutive pseudo-gradients H = -Δ/η along the retrain
        lips = [
            float((steps[i + 1] - steps[i]).norm()) / (eta * step_norms[i])
            for i in range(total - 1)
            if step_norms[i] > 0
        ]
        lip = max(lips, default=0.0)
        g_max = (
            max(
                [step_norms[i] for i in range(total)]
                + [t["max_stored_norm"] for t in trace]
                + [t["max_fresh_norm"] for t in trace]
            )
            / eta
        )
        scorer = ReferenceScorer(context.clients.model, context.reference.x, context.reference.y)
        delta_f = scorer.loss(start)  # F(Mtilde_0) - F(M*) <= F(Mtilde_0)
        rows = []
        crab_path = 0.0
        sig_sq = 0.0
        for r, item in enumerate(trace, start=1):
            crab_path += item["step_norm"]
            tau = min(total, math.ceil(r * total / max(num_replayed, 1)))
            retrain_path = sum(step_norms[:tau])
            observed = float((item["params"] - trajectory[tau]).norm())
            sig_sq += item["sigma_sum"] ** 2  # Σ_{i=0}^{r-1} σcheck_i^2
            c = (lip / 2) * eta**2 * g_max**2
            # Theorem 1 as printed, and B_safe from eqs. 24 and 27
            paper = math.sqrt(eta * (delta_f * (r + tau) + c * (r * sig_sq + tau)))
            safe = math.sqrt(eta * r * (delta_f + c * sig_sq)) + math.sqrt(
                eta * tau * (delta_f + c * tau)
            )
            triangle = crab_path + retrain_path
            rows.append(
                {
                    "r": r,
                    "tau": tau,
                    "observed": observed,
                    "triangle": triangle,
                    "safe": safe,
                    "paper": paper,
                    "observed_over_paper": observed / paper if paper > 0 else None,
                    "observed_over_safe": observed / safe if safe > 0 else None,
                }
            )
        return {
            "eta": eta,
            "L": lip,
            "G": g_max,
            "delta_F": delta_f,
            "rows": rows,
            "triangle_holds": all(x["observed"] <= x["triangle"] * (1 + 1e-5) + 1e-6 for x in rows),
            "paper_holds": all(x["observed"] <= x["paper"] for x in rows),
            "safe_holds": all(x["observed"] <= x["safe"] for x in rows),
            "reference_retrain_cost": reference_cost,
        }
