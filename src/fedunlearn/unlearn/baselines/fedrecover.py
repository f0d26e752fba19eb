"""FedRecover: replay training without the removed clients, estimating most client updates.

The server replays the T rounds from M_0 with the remaining clients only. In *exact* rounds the
clients train (warm-up, periodic correction, final tuning); in the other rounds the server
estimates each client's update from its stored one by the Cauchy mean-value theorem,
``g_i(w_hat_t) ~ g_bar_i_t + B_i (w_hat_t - w_bar_t)``, with ``B_i`` the compact L-BFGS matrix
of the client's secant pairs from exact rounds (:mod:`fedunlearn.linalg.lbfgs`). An estimate with
a coordinate above the threshold tau is *abnormal* and replaced by an exact update.

Sign convention: clients upload ``delta = w_local - w_global`` and the server applies
``w_{t+1} = w_t + A(deltas)``, so the paper's gradient is ``g = -delta`` (server lr 1). A secant
pair of client i in round t is ``(dw, dg) = (w_hat_t - w_bar_t, g_i - g_bar_i)
= (w_hat_t - w_bar_t, delta_bar_i - delta_i)`` and the estimate is
``delta_hat_i = -(g_bar_i + B_i v) = delta_bar_i - B_i v`` with ``v = w_hat_t - w_bar_t``.
Toolkit round r (1-based) is paper round t = r - 1: it starts from ``w_bar_{r-1}``
(``history.read_model(r - 1)``) and its stored updates are ``history.read_update(r, i)``.

Trajectory: the T replayed rounds are the result's trajectory (``UnlearnResult.trajectory``),
each with the updates it aggregated; the L-BFGS estimates are marked estimated, the exact
updates (warm-up, correction, abnormality fixing, no pair, final tuning) are not
(docs/lifecycle.md). On an applied history T is the store's round count L.

Paper: Cao, Jia, Zhang, Gong, "FedRecover: Recovering from Poisoning Attacks in Federated Learning
using Historical Information", IEEE S&P 2023, arXiv:2210.10936, Algorithm 1 and its four
strategies (warm-up, periodic correction, abnormality fixing, final tuning). The comments cite
the lines of Listing FR, Algorithm 1 restated in toolkit terms in docs/methods/baselines.md.

Deviations (tags of docs/methods/baselines.md, where each is argued):
    FR1 defaults T_w = 5, T_c = 10, T_f = 5, s = 2, alpha = 1e-6 (the secondary sources' T_w = 20
    leaves almost nothing to estimate at T = 40); ``correction_period=None`` (or inf) disables
    periodic correction ("FedRecover without correction").
    FR2 short runs: T_w is clamped to T and T_f to T - T_w. Round r is exact iff ``r <= T_w`` or
    ``r > T - T_f`` or ``(r - T_w) % T_c == 0`` (the paper's ``(t - T_w + 1) mod T_c == 0``).
    FR3 participants: a remaining client takes part in round r iff its update of round r was
    accepted in the original run; exact requests and estimates go to those clients, in
    ascending id order.
    FR4 exact updates are screened as in training (``fl.engine.screen_update``): a non-finite one
    is left out of the aggregate and listed in ``details.rejected_updates``.
    FR5 tau: tau_t is the (floor(alpha N_t) + 1)-th largest |coordinate| of the remaining
    participants' stored updates of round t (N_t coordinates), found by a running top-k over one
    update at a time; tau = max_t tau_t over rounds 1..T. It is computed only when some round is
    estimated and abnormality fixing is on and no ``tau`` override is given. Where the records
    carry each update's largest |coordinate| (``MAX_ABS_KEY``), only the updates that can hold
    one of the k largest values are read (at most k a round; same tau_t bit for bit).
    FR6 an estimate with a non-finite coordinate is abnormal whatever tau is.
    FR7 buffers: ``paired`` (default) keeps per client the newest s pairs ``(dw_t, dg_i_t)``; an
    exact round pushes the shared ``dw_t`` (one tensor, not copied) into every participant's
    buffer, an abnormality fix into that client's only. ``paper_literal`` keeps one ``DW`` and
    per-client ``DG_i`` columns and pairs them by position (newest with newest), as the paper's
    buffer rule reads; it assumes full participation, as the paper does.
    FR8 guards (LB1): in ``paired`` mode a degenerate or non-positive-curvature pair never
    enters a buffer (so round 1, where ``dw = 0``, takes no slot); in ``paper_literal`` mode the
    guards filter the positional pairs at each setup. A client with no usable pair is asked for an
    exact update and counted in ``details.no_pair_requests``.
    FR9 ``v = 0`` (the forgotten clients did not affect round r yet) gives ``B v = 0``, so the
    stored update is used as it is, with or without pairs.
    FR10 stored updates and global models are read only when used: exact rounds after the last
    estimated round need no pairs, so T_c = 1 costs exactly what Retrain costs. The tau pass
    reads at most k updates a round (FR5); on a run recorded without ``MAX_ABS_KEY``, every
    remaining participant's stored update once more (history bytes read ~double).
    FR11 costs: ``estimated_updates`` counts the estimates that entered an aggregate; an
    estimate replaced by an exact update (abnormal, or no pair) counts as a client request only.
    FR12 multi-step local training: the "Hessian" is the Jacobian of the local-update map and
    the mean-value argument is heuristic (Theorem 1 assumes convex clients and FedAvg); a
    per-round lr is moot: the toolkit's local lr is constant and the server lr is 1.
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from pydantic import Field, field_validator

from fedunlearn.fl.clients import TrainTask
from fedunlearn.fl.engine import screen_update
from fedunlearn.history.policy import MAX_ABS_KEY
from fedunlearn.linalg.lbfgs import (
    CompactBFGS,
    GuardCounts,
    NoCurvaturePairsError,
    SecantBuffer,
    pair_problem,
    step_stats,
)
from fedunlearn.unlearn.base import Details, MethodParams, RunOutput, Unlearner, UnlearnRequest
from fedunlearn.unlearn.complete_history import refuse_missing_updates, require_every_round
from fedunlearn.unlearn.context import UnlearnContext
from fedunlearn.unlearn.registry import register
from fedunlearn.unlearn.replay import records_describe_stored_updates
from fedunlearn.unlearn.trajectory_log import TrajectoryLog

__all__ = ["FedRecover", "FedRecoverParams", "Schedule", "kth_largest_abs", "round_thresholds"]

log = logging.getLogger(__name__)


class FedRecoverParams(MethodParams):
    """FedRecover hyperparameters (paper symbols in brackets)."""

    warmup_rounds: int = Field(5, ge=0, le=1_000_000, description="T_w: first rounds exact")
    correction_period: int | None = Field(
        10, ge=1, le=1_000_000, description="T_c: every T_c-th later round exact; None = never"
    )
    final_rounds: int = Field(5, ge=0, le=1_000_000, description="T_f: last rounds exact")
    buffer_size: int = Field(2, ge=1, le=64, description="s: secant pairs per client")
    alpha: float = Field(1e-6, ge=0, le=1, description="tolerance rate defining tau")
    tau: float | None = Field(None, ge=0, description="abnormality threshold override")
    abnormality_fixing: bool = Field(True, description="replace abnormal estimates by exact ones")
    buffer_mode: Literal["paired", "paper_literal"] = "paired"

    @field_validator("correction_period", mode="before")
    @classmethod
    def _infinite_period(cls, value: Any) -> Any:
        """Map an infinite period (YAML ``.inf``) to None: never correct."""
        if isinstance(value, float) and math.isinf(value) and value > 0:
            return None
        return value


@dataclass(frozen=True)
class Schedule:
    """Which toolkit rounds are exact: warm-up, periodic correction, final tuning (FR2).

    Attributes:
        num_rounds: T.
        warmup_rounds: T_w after clamping to T.
        correction_period: T_c, or None for no periodic correction.
        final_rounds: T_f after clamping to T - T_w.
    """

    num_rounds: int
    warmup_rounds: int
    correction_period: int | None
    final_rounds: int

    @classmethod
    def clamped(cls, params: FedRecoverParams, num_rounds: int) -> Schedule:
        """Return the schedule of ``params`` for a run of ``num_rounds`` rounds."""
        warmup = min(params.warmup_rounds, num_rounds)
        final = min(params.final_rounds, num_rounds - warmup)
        return cls(num_rounds, warmup, params.correction_period, final)

    def is_exact(self, round_: int) -> bool:
        """Return whether toolkit round ``round_`` (1-based) is an exact round."""
        if round_ <= self.warmup_rounds or round_ > self.num_rounds - self.final_rounds:
            return True
        period = self.correction_period
        # Paper: (t - T_w + 1) mod T_c == 0 with t = r - 1.
        return period is not None and (round_ - self.warmup_rounds) % period == 0

    def exact_rounds(self) -> list[int]:
        """Return the exact rounds, ascending."""
        return [r for r in range(1, self.num_rounds + 1) if self.is_exact(r)]

    def exact_per_client(self) -> int:
        """Exact updates of a client taking part in every round, with tau = inf."""
        middle = self.num_rounds - self.warmup_rounds - self.final_rounds
        corrections = 0 if self.correction_period is None else middle // self.correction_period
        return self.warmup_rounds + self.final_rounds + corrections

    def to_dict(self) -> dict[str, int | None]:
        """Return the effective schedule as a JSON-ready dict."""
        return {
            "num_rounds": self.num_rounds,
            "warmup_rounds": self.warmup_rounds,
            "correction_period": self.correction_period,
            "final_rounds": self.final_rounds,
        }


def kth_largest_abs(chunks: Iterable[torch.Tensor], k: int, total: int) -> float:
    """Return the k-th largest ``|x|`` over the concatenation of ``chunks``, streaming.

    Holds one chunk plus ``min(k, total - k + 1)`` candidates, never all values at once. Once
    the k largest candidates are full, a chunk whose largest ``|x|`` does not exceed the current
    k-th largest is skipped after one min/max pass (it cannot change the answer), instead of a
    top-k over it: most chunks, for FedRecover's small k.

    Args:
        chunks: Tensors whose values together number ``total``.
        k: Rank, 1-based (1 = the largest); ``k > total`` gives 0.0.
        total: Number of values in all chunks.

    Raises:
        ValueError: if ``k < 1`` or the chunks do not hold ``total`` values.
    """
    if k < 1:
        raise ValueError(f"rank k must be >= 1; got {k}")
    largest = k <= total - k + 1  # keep the k largest, else the (total - k + 1) smallest
    keep = k if largest else total - k + 1
    seen = 0
    candidates: torch.Tensor | None = None
    for chunk in chunks:
        flat = chunk.detach().reshape(-1)
        seen += flat.numel()
        if keep <= 0 or flat.numel() == 0:
            continue
        if largest and candidates is not None and candidates.numel() == keep:
            low, high = torch.aminmax(flat)
            # max |x| of the chunk (NaN if it has one: NaN compares false, so it is kept)
            if bool(torch.maximum(high, -low) <= candidates.min()):
                continue  # nothing in it beats the current k-th largest
        values = flat.abs()
        pool = values if candidates is None else torch.cat((candidates, values))
        candidates = pool.topk(min(keep, pool.numel()), largest=largest, sorted=False).values
    if seen != total:
        raise ValueError(f"the chunks hold {seen} values; expected {total}")
    if k > total or candidates is None:
        return 0.0
    return float(candidates.min() if largest else candidates.max())


def round_thresholds(
    context: UnlearnContext,
    participants: Mapping[int, Sequence[int]],
    alpha: float,
    maxima: Mapping[int, Mapping[int, float]] | None = None,
) -> dict[int, float]:
    """Return tau_t per round: at most a fraction alpha of |coordinates| exceeds it (FR5).

    Args:
        context: The unlearning context (stored updates are read through its metered history).
        participants: Round -> remaining participants whose stored updates form the pool.
        alpha: Tolerance rate.
        maxima: Round -> client -> the recorded ||update||_inf (``MAX_ABS_KEY``), where the
            recorder kept it. A round whose participants all have one reads only the updates
            that can hold one of the k largest values (``_kth_largest_abs_of``); other rounds
            read every update (a run recorded before the statistic existed).

    Returns:
        Round -> tau_t, for rounds with at least one participant.
    """
    out: dict[int, float] = {}
    p = context.clients.num_params
    for round_, ids in participants.items():
        if not ids:
            continue
        total = len(ids) * p
        k = math.floor(alpha * total) + 1
        known = (maxima or {}).get(round_, {})
        if k <= p and all(cid in known for cid in ids):
            for cid in ids:  # tau_t depends on every update of the pool: the lineage says so
                if (reads := context.read_log) is not None:
                    reads.record("update", round_, cid)
            read = functools.partial(context.history.read_update, round_)
            out[round_] = _kth_largest_abs_of(read, {cid: known[cid] for cid in ids}, k)
            continue
        updates = (context.history.read_update(round_, cid) for cid in ids)
        out[round_] = kth_largest_abs(updates, k, total)
    return out


def _kth_largest_abs_of(
    read: Callable[[int], torch.Tensor], maxima: Mapping[int, float], k: int
) -> float:
    """Return the k-th largest |x| over the updates of ``maxima``'s clients, reading few of them.

    Reads the updates in decreasing order of their recorded largest |x| and stops once the k
    largest values read so far are all at least the next update's largest |x|: no unread value
    can displace them. The answer is one value of the multiset, so it equals
    ``kth_largest_abs`` over all updates, bit for bit, whatever the reading order. At
    FedRecover's k (2 for 10 MLP updates) this reads at most k updates a round.

    Args:
        read: Client id -> its stored update.
        maxima: Client id -> its update's recorded ||update||_inf (finite).
        k: Rank, 1-based, at most one update's size.
    """
    candidates: torch.Tensor | None = None
    for cid in sorted(maxima, key=lambda c: (-maxima[c], c)):
        if candidates is not None and candidates.numel() == k:
            if maxima[cid] <= float(candidates.min()):
                break  # this update and every later one: no |x| above the k-th largest
        values = read(cid).detach().reshape(-1).abs()
        pool = values if candidates is None else torch.cat((candidates, values))
        candidates = pool.topk(min(k, pool.numel()), sorted=False).values
    if candidates is None or candidates.numel() < k:
        return 0.0
    return float(candidates.min())


class _PairedBuffers:
    """Deviation FR7 ``paired``: one buffer of (dw, dg_i) pairs per client."""

    def __init__(self, capacity: int, counts: GuardCounts) -> None:
        self.capacity = capacity
        self.counts = counts
        self.buffers: dict[int, SecantBuffer] = {}
        self.pushed: Counter[int] = Counter()  # pairs that entered client i's buffer

    def _buffer(self, cid: int) -> SecantBuffer:
        if cid not in self.buffers:
            self.buffers[cid] = SecantBuffer(self.capacity, self.counts)
        return self.buffers[cid]

    def push_round(self, dw: torch.Tensor, dgs: Mapping[int, torch.Tensor], w_norm: float) -> None:
        stats = step_stats(dw)  # one step for every participant: its float64 norm once
        for cid, dg in dgs.items():
            self.push_fix(cid, dw, dg, w_norm, stats)

    def push_fix(
        self,
        cid: int,
        dw: torch.Tensor,
        dg: torch.Tensor,
        w_norm: float,
        stats: tuple[torch.Tensor, float] | None = None,
    ) -> None:
        self.pushed[cid] += self._buffer(cid).push(dw, dg, w_norm, stats)

    def hvp(self, cid: int, v: torch.Tensor) -> torch.Tensor:
        return self._buffer(cid).hvp(v)


class _PaperLiteralBuffers:
    """Deviation FR7 ``paper_literal``: one DW, per-client DG_i, paired by position."""

    def __init__(self, capacity: int, counts: GuardCounts) -> None:
        self.counts = counts
        self.dw: deque[tuple[torch.Tensor, float]] = deque(maxlen=capacity)
        self.dg: dict[int, deque[torch.Tensor]] = {}
        self.capacity = capacity
        self._dw_version = 0
        self._dg_version: Counter[int] = Counter()
        self.pushed = self._dg_version  # DG_i columns pushed
        self._cache: dict[int, tuple[tuple[int, int], CompactBFGS | None]] = {}

    def _push_dg(self, cid: int, dg: torch.Tensor) -> None:
        self.dg.setdefault(cid, deque(maxlen=self.capacity)).append(dg)
        self._dg_version[cid] += 1

    def push_round(self, dw: torch.Tensor, dgs: Mapping[int, torch.Tensor], w_norm: float) -> None:
        self.dw.append((dw, w_norm))
        self._dw_version += 1
        for cid, dg in dgs.items():
            self._push_dg(cid, dg)

    def push_fix(
        self,
        cid: int,
        dw: torch.Tensor,
        dg: torch.Tensor,
        w_norm: float,
        stats: tuple[torch.Tensor, float] | None = None,
    ) -> None:
        self._push_dg(cid, dg)  # the paper updates DG_i only, not DW

    def hvp(self, cid: int, v: torch.Tensor) -> torch.Tensor:
        if not bool(v.any()):
            return torch.zeros_like(v)
        key = (self._dw_version, self._dg_version[cid])
        cached = self._cache.get(cid)
        if cached is None or cached[0] != key:
            # The k-th newest columns of DW and DG_i form a pair; guards (a), (b) filter them.
            newest_first = zip(reversed(self.dw), reversed(self.dg.get(cid, ())), strict=False)
            pairs = []
            for (dw, w_norm), dg in reversed(list(newest_first)):
                problem = pair_problem(dw, dg, w_norm)
                if problem is None:
                    pairs.append((dw, dg))
                else:
                    setattr(self.counts, problem, getattr(self.counts, problem) + 1)
            try:
                operator: CompactBFGS | None = CompactBFGS(pairs, self.counts)
            except NoCurvaturePairsError:
                operator = None
            cached = (key, operator)
            self._cache[cid] = cached
        if cached[1] is None:
            self.counts.no_pairs += 1
            raise NoCurvaturePairsError(f"client {cid} has no usable secant pair")
        return cached[1].matvec(v)


@dataclass
class _Replay:
    """The replay's running state: tau, the secant buffers and the per-client tallies."""

    tau: float
    buffers: _PairedBuffers | _PaperLiteralBuffers
    requests: Counter[int] = field(default_factory=Counter)  # exact updates asked per client
    fixes: Counter[int] = field(default_factory=Counter)  # abnormality fixes per client
    no_pair: Counter[int] = field(default_factory=Counter)  # no-pair exact requests per client
    rejected: list[dict[str, Any]] = field(default_factory=list)
    estimated_total: int = 0


@dataclass(frozen=True)
class FedRecoverDetails(Details):
    """What ``fedrecover`` did.

    Attributes:
        schedule: The effective schedule (rounds, warm-up, correction period, final tuning).
        buffer_size: L-BFGS pairs per client (s).
        buffer_mode: How pairs enter the buffer.
        exact_rounds: Rounds whose updates were all exact (warm-up, corrections, final tuning).
        estimated_rounds: The other rounds.
        tau: The abnormality threshold used (max over rounds; inf when never tested).
        tau_per_round: Round -> tau_t (empty unless computed from the stored updates).
        exact_updates: Exact client updates requested.
        estimated_updates: Client updates the server estimated.
        exact_updates_per_client: Client -> exact updates requested of it.
        abnormality_fixes: Client -> estimates replaced by an exact update (||g||_inf > tau).
        no_pair_requests: Client -> exact requests because its buffer held no pair.
        pairs_pushed: Client -> curvature pairs pushed.
        guard_counts: How often each L-BFGS guard fired.
        rejected_updates: Exact uploads left out (round, client_id, reason).
    """

    schedule: dict[str, int | None]
    buffer_size: int
    buffer_mode: str
    exact_rounds: tuple[int, ...]
    estimated_rounds: tuple[int, ...]
    tau: float
    tau_per_round: dict[int, float]
    exact_updates: int
    estimated_updates: int
    exact_updates_per_client: dict[int, int]
    abnormality_fixes: dict[int, int]
    no_pair_requests: dict[int, int]
    pairs_pushed: dict[int, int]
    guard_counts: dict[str, int]
    rejected_updates: tuple[dict[str, Any], ...]


@register("fedrecover")
class FedRecover(Unlearner[FedRecoverParams]):
    """FedRecover (Cao et al., S&P 2023): replay with estimated updates and exact corrections.

    Steps of ``_run``, in order: find each round's remaining participants and check their stored
    updates; compute tau (FR5); replay rounds 1..T from M_0, where an exact round asks the
    participants to train and pushes secant pairs, and an estimated round estimates every
    participant's update from its stored one and its L-BFGS buffer, replacing abnormal or
    pair-less estimates by exact updates; aggregate with the run's rule and evaluate.

    ``UnlearnResult.details`` holds: ``schedule`` (effective T, T_w, T_c, T_f), ``buffer_size``,
    ``buffer_mode``, ``exact_rounds``, ``estimated_rounds``, ``tau`` (inf when fixing is off or
    nothing is estimated) and ``tau_per_round`` (empty unless tau was derived from alpha),
    ``exact_updates`` and ``estimated_updates`` (totals), ``exact_updates_per_client``,
    ``abnormality_fixes`` and ``no_pair_requests`` (per remaining client), ``pairs_pushed``
    (secant pairs that entered each client's buffer), ``guard_counts`` (LB1) and
    ``rejected_updates`` (non-finite exact updates left out).
    """

    serves_generations = True  # an applied trajectory (docs/lifecycle.md)
    params_type = FedRecoverParams
    required_policies = frozenset({"all"})

    def history_bytes_needed(self, context: UnlearnContext) -> int:
        """Global models w_bar_0..w_bar_{T-1} and every client's update of every round."""
        history = context.history
        updates = sum(
            sum(1 for rec in history.client_records(r) if rec.status == "accepted")
            for r in range(1, context.num_rounds + 1)
        )
        return (context.num_rounds + updates) * context.clients.num_params * 4

    def _participants(
        self, context: UnlearnContext
    ) -> tuple[dict[int, list[int]], dict[int, dict[int, float]]]:
        """Return round -> sorted remaining participants, and their recorded ||update||_inf.

        The second map holds, per round, the clients whose record carries a finite
        ``MAX_ABS_KEY`` (a run recorded before it existed has none, and a run whose records do
        not describe its stored copies, a float16 run recorded before they did, gives none:
        tau reads every update).

        Raises:
            UnsupportedHistoryError: a global model or a remaining participant's update is
                missing.
        """
        history = context.history
        remaining = set(context.clients.client_ids)
        require_every_round(context, "fedrecover")
        participants: dict[int, list[int]] = {}
        maxima: dict[int, dict[int, float]] = {}
        exact_copies = records_describe_stored_updates(context)  # RunMeta decides
        missing: list[tuple[int, int]] = []
        for r in range(1, context.num_rounds + 1):
            records = [
                rec
                for rec in history.client_records(r)  # by client id
                if rec.status == "accepted" and rec.client_id in remaining
            ]
            missing += [(r, rec.client_id) for rec in records if not rec.stored]
            participants[r] = [rec.client_id for rec in records]
            maxima[r] = {
                rec.client_id: float(value)
                for rec in records
                if exact_copies
                and isinstance(value := rec.scalars.get(MAX_ABS_KEY), float)
                and math.isfinite(value)
            }
        refuse_missing_updates(
            missing,
            "fedrecover needs every remaining client's stored update",
            ", e.g. deleted by forget()",
        )
        return participants, maxima

    def _exact(
        self,
        context: UnlearnContext,
        params: torch.Tensor,
        client_ids: Sequence[int],
        round_: int,
        requests: Counter[int],
        rejected: list[dict[str, Any]],
    ) -> dict[int, torch.Tensor]:
        """Ask ``client_ids`` for exact updates at ``params`` with round ``round_``'s seeds."""
        updates = context.clients.train(TrainTask(params, client_ids, round_))
        out: dict[int, torch.Tensor] = {}
        for update in updates:
            requests[update.client_id] += 1
            reason = screen_update(update, context.clients.num_params)
            if reason is None:
                out[update.client_id] = update.delta
            else:
                log.warning("round %d: rejected client %d: %s", round_, update.client_id, reason)
                rejected.append({"round": round_, "client_id": update.client_id, "reason": reason})
        return out

    def _tau(
        self,
        context: UnlearnContext,
        participants: Mapping[int, Sequence[int]],
        maxima: Mapping[int, Mapping[int, float]],
        estimates: bool,
    ) -> tuple[float, dict[int, float]]:
        """FR5: tau = max_t tau_t (and tau_t per round), only if some estimate could be tested."""
        p = self.params
        if not p.abnormality_fixing or not estimates:
            return math.inf, {}
        if p.tau is not None:
            return p.tau, {}
        per_round = round_thresholds(context, participants, p.alpha, maxima)
        return max(per_round.values(), default=math.inf), per_round

    def _estimated_round(
        self,
        context: UnlearnContext,
        state: _Replay,
        w_hat: torch.Tensor,
        r: int,
        ids: Sequence[int],
        w_norm: float,
    ) -> tuple[dict[int, torch.Tensor], set[int]]:
        """Estimate the participants' updates of round ``r`` (Listing FR lines 12-18).

        Returns the round's updates (estimates, and exact ones where an estimate was abnormal or
        had no pair) and the clients whose update is an estimate.
        """
        history, buffers = context.history, state.buffers
        v = w_hat - history.read_model(r - 1)
        deltas: dict[int, torch.Tensor] = {}
        stored: dict[int, torch.Tensor] = {}
        for cid in ids:
            delta_bar = history.read_update(r, cid)
            try:
                # delta_hat = -(g_bar + B v) = delta_bar - B v
                estimate = delta_bar - buffers.hvp(cid, v)
            except NoCurvaturePairsError:
                state.no_pair[cid] += 1  # FR8: no usable pair, ask for an exact update
                stored[cid] = delta_bar
                continue
            peak = float(estimate.abs().max()) if estimate.numel() else 0.0
            if not math.isfinite(peak) or (self.params.abnormality_fixing and peak > state.tau):
                state.fixes[cid] += 1  # abnormality fixing: ||g_hat||_inf > tau
                stored[cid] = delta_bar
                continue
            deltas[cid] = estimate
        state.estimated_total += len(deltas)
        estimated = set(deltas)
        context.meter.add(estimated_updates=len(deltas))
        if stored:
            exact = self._exact(context, w_hat, sorted(stored), r, state.requests, state.rejected)
            stats = step_stats(v) if exact and isinstance(buffers, _PairedBuffers) else None
            for cid, delta in exact.items():
                buffers.push_fix(cid, v, stored[cid] - delta, w_norm, stats)
                deltas[cid] = delta
        return deltas, estimated

    def _run(self, request: UnlearnRequest, context: UnlearnContext) -> RunOutput:
        p = self.params
        history, num_rounds = context.history, context.num_rounds
        # before any client work or payload read
        participants, maxima = self._participants(context)
        schedule = Schedule.clamped(p, num_rounds)
        estimated_rounds = [r for r in range(1, num_rounds + 1) if not schedule.is_exact(r)]
        last_estimated = max(estimated_rounds, default=0)
        if estimated_rounds and schedule.warmup_rounds <= p.buffer_size:
            warnings.warn(
                f"fedrecover: warm-up T_w={schedule.warmup_rounds} should exceed the buffer size "
                f"s={p.buffer_size} (paper); the first estimates use fewer pairs",
                stacklevel=3,
            )
        tau, tau_per_round = self._tau(context, participants, maxima, bool(estimated_rounds))
        counts = GuardCounts()
        state = _Replay(
            tau,
            _PairedBuffers(p.buffer_size, counts)
            if p.buffer_mode == "paired"
            else _PaperLiteralBuffers(p.buffer_size, counts),
        )
        rows: list[dict[str, float]] = []
        trajectory = TrajectoryLog(context)
        w_hat = context.start_from(0)  # Listing FR line 1: w_hat_0 = w_bar_0 (the stored M_0)
        for r in range(1, num_rounds + 1):
            ids = participants[r]
            w_norm = float(w_hat.norm())
            rejected_before = len(state.rejected)
            estimated: set[int] = set()
            if schedule.is_exact(r):
                # EXACT_ROUND (Listing FR lines 3-7): fresh updates, secant pairs if still needed.
                deltas = self._exact(context, w_hat, ids, r, state.requests, state.rejected)
                if r < last_estimated and deltas:
                    dw = w_hat - history.read_model(r - 1)
                    # dg = g - g_bar = -(delta - delta_bar)
                    dgs = {cid: history.read_update(r, cid) - d for cid, d in deltas.items()}
                    state.buffers.push_round(dw, dgs, w_norm)
            else:
                deltas, estimated = self._estimated_round(context, state, w_hat, r, ids, w_norm)
            kept = [(cid, deltas[cid]) for cid in ids if cid in deltas]
            if kept:
                aggregate = context.aggregate(kept)
                w_hat = w_hat + aggregate
            else:
                log.warning("round %d: no update from a remaining client; model unchanged", r)
                aggregate = torch.zeros_like(w_hat)
            row = context.end_round(r, w_hat)
            if context.evaluate is not None:
                rows.append(row)
            trajectory.add(
                w_hat,
                aggregate,
                kept,
                estimated=estimated,
                rejected=[(x["client_id"], x["reason"]) for x in state.rejected[rejected_before:]],
                scalars=row,
            )
        details = self._details(context, schedule, estimated_rounds, tau_per_round, state, counts)
        return RunOutput(w_hat, rows, details, trajectory.trajectory(request.forget))

    def _details(
        self,
        context: UnlearnContext,
        schedule: Schedule,
        estimated_rounds: Sequence[int],
        tau_per_round: dict[int, float],
        state: _Replay,
        counts: GuardCounts,
    ) -> FedRecoverDetails:
        guard_counts = counts.to_dict()
        if any(guard_counts.values()):
            log.info("fedrecover guards fired: %s", guard_counts)
        ids = context.clients.client_ids
        return FedRecoverDetails(
            schedule=schedule.to_dict(),
            buffer_size=self.params.buffer_size,
            buffer_mode=self.params.buffer_mode,
            exact_rounds=tuple(schedule.exact_rounds()),
            estimated_rounds=tuple(estimated_rounds),
            tau=state.tau,
            tau_per_round=tau_per_round,
            exact_updates=sum(state.requests.values()),
            estimated_updates=state.estimated_total,
            exact_updates_per_client=dict(sorted(state.requests.items())),
            abnormality_fixes={cid: state.fixes[cid] for cid in ids},
            no_pair_requests={cid: state.no_pair[cid] for cid in ids},
            pairs_pushed={cid: state.buffers.pushed[cid] for cid in ids},
            guard_counts=guard_counts,
            rejected_updates=tuple(state.rejected),
        )
