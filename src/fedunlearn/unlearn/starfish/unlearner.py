"""Starfish unlearning (Stage II): one loop, run on the plaintext mirror or on two 2PC servers.

The servers remove the targets from a finished run using the history they hold as shares
(Stage I, spec §4: every client's update, its norm and its alpha-quantile threshold) and the
public global models. ``Starfish.replay`` follows the loop of spec §5.6:

1. TD (threshold determination): TD^2, per remaining client delta^j = SecMax_r delta_r^j
   (default), or TD^1, one FedRecover-style global threshold (cost comparison);
2. SecRS: score every round by the cosine of the targets' update with the global update, open
   the top T' = ceil(sigma T) round indices and replay them chronologically (A4);
3. replay from M_0: the first K_w selected rounds are exact for every remaining participant
   (implicit warm-up filling the L-BFGS buffers, A9); later rounds estimate each participant's
   update with SecUE (compact L-BFGS, or the literal two-loop); in correction rounds
   (r mod T_c == 0, A11) SecTC opens one flag per client and flagged clients recompute exactly
   at M_hat with the run's seeds of round r (A12); exact gradients feed the buffers (A8);
4. open the FedAvg aggregate of every round (weights n_j over the round's remaining
   participants, A2) and step M_hat <- M_hat - eta_u G_hat^agg with eta_u = eta_l (A20);
5. report ARP = mean_j (T - T_r^j) / T * 100 (A25), the openings, and the op counts per step.

Every arithmetic step runs on a ``StarfishBackend`` (``backend/protocol.py``);
``backend="plain"`` is the float64 plaintext mirror (spec §12 item 6); ``backend="mpc"`` runs
the loop once per server on ``MpcBackend`` (``backend/mpc.py``; two threads,
``deploy/servers.run_in_process``); ``fedunlearn starfish-local`` runs the servers as
processes. Exact updates come through a ``ClientGateway`` as secrets (the run's federation
in-process, or the dealer process's simulated clients). What the servers open is
logged in ``details.opened`` (phase, label, shape); a 2PC run adds ``details.mpc_costs``.

Paper: Liu, Ye, Jiang, Shen, Guo, Tjuawinata, Lam, "Privacy-Preserving Federated Unlearning with
Certified Client Removal", Alg. 1-4 (Stage I and II), Sec. IV-V; Starfish spec §5.6, §11.

Deviations:
    [REC] Units (A1): ``units="gradient"`` stores G = -delta / eta_l (pseudo-gradient) and
        eta_l = the run's local lr; ``units="delta"`` is the model-delta mode (G = -delta,
        eta_l = 1). With ``precision="model"`` (the run's float32) and ``units="delta"`` an
        all-exact replay with sigma = 1 reproduces Retrain bit for bit; the default mirror is
        float64 (``precision="float64"``), whose aggregate differs from float32 FedAvg in the
        last bits.
    [REC] Participants: a remaining client takes part in round r iff its round-r update was
        accepted in the original run (FedRecover's rule; the paper assumes full participation);
        exact requests go to them in ascending id order, as Retrain samples them.
    [REC] Aggregation is always FedAvg (spec §4.2: SecAdd_A); a run trained with another rule
        is unlearned with FedAvg, with a warning.
    [REC] A client whose buffer holds no usable pair when its update must be estimated (v != 0)
        is asked for an exact update (counted in ``no_pair_requests`` and in T_r); v == 0 needs
        no pair (B 0 = 0).
    [REC] Pairs are made only while an estimated round is still ahead; warm-up and flagged
        corrections push them (A8, FIFO of size B). Exact uploads are screened as in training
        (a non-finite one is left out of the aggregate and listed in ``rejected_updates``).
    [REC] ``final_rounds`` (optional final tuning, spec §5.7 [R]) defaults to 0, as in the
        paper; ``warmup_rounds=None`` means K_w = B (A9).
    [REC] ``round_selection="auto"`` picks Method 1 iff T < T_delta (spec §5.3); the default is
        Method 1 (A18).
    [REC] ``backend="mpc"`` runs both 2PC servers in this process (two threads, in-process
        transport, Stage I shares in temporary per-server stores); fixed point f = 16 by
        default, not the paper's 13: at 13 the replay's absolute error (2^-13 per operation
        on O(1e-3) curvature entries) flipped a correction flag whose plaintext margin was
        1.5% on the convex test run (spec §3.1 recommends 16-20 for small gradients).
    [I] The plaintext mirror derives Stage I's norms and thresholds from the stored updates at
        unlearning time (alpha must equal the one the clients would have used).
"""

from __future__ import annotations

import logging
import math
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch
from pydantic import Field

from fedunlearn.errors import UnsupportedHistoryError
from fedunlearn.fl.engine import screen_update
from fedunlearn.linalg.lbfgs import DEGENERATE_STEP_RTOL, GuardCounts, NoCurvaturePairsError
from fedunlearn.unlearn.base import Details, MethodParams, RunOutput, Unlearner, UnlearnRequest
from fedunlearn.unlearn.context import UnlearnContext
from fedunlearn.unlearn.registry import register
from fedunlearn.unlearn.starfish.backend.protocol import PlainBackend, StarfishBackend
from fedunlearn.unlearn.starfish.steps import (
    CurvatureBuffer,
    SelectionMethod,
    StageOneRecord,
    check_thresholds,
    select_rounds,
    switching_threshold,
    threshold_td1,
    thresholds_td2,
)

__all__ = [
    "ClientGateway",
    "LocalClients",
    "Starfish",
    "StarfishParams",
    "average_round_saving",
]

log = logging.getLogger(__name__)


class StarfishParams(MethodParams):
    """Starfish hyperparameters (paper symbols in the descriptions)."""

    selection_rate: float = Field(0.6, gt=0, le=1, description="sigma: T' = ceil(sigma T)")
    tolerance_rate: float = Field(0.4, ge=0, le=1, description="alpha: threshold quantile (A13)")
    interval_rate: float = Field(0.1, gt=0, le=1, description="beta: T_c = ceil(beta T)")
    buffer_size: int = Field(2, ge=1, le=64, description="B: curvature pairs per client")
    warmup_rounds: int | None = Field(
        None, ge=0, le=1_000_000, description="K_w: first selected rounds exact; None = B"
    )
    final_rounds: int = Field(0, ge=0, le=1_000_000, description="optional final tuning rounds")
    unlearning_rate: float | None = Field(
        None, gt=0, le=1e6, description="eta_u; None = eta_l (A20)"
    )
    round_selection: Literal["method1", "method2", "alt_method1", "alt_method2", "auto"] = "method1"
    threshold_mode: Literal["td2", "td1"] = "td2"
    estimator: Literal["compact", "two_loop"] = "compact"
    correction_index: Literal["round", "counter"] = Field(
        "round", description="correct when r mod T_c == 0 (round) or k mod T_c == 0 (counter)"
    )
    curvature_check: bool = Field(False, description="secret s^T y > 0 check, 1 bit opened")
    units: Literal["gradient", "delta"] = "gradient"
    precision: Literal["float64", "model"] = "float64"
    backend: Literal["plain", "mpc"] = Field(
        "plain", description="plain float64 mirror, or 2PC (two servers, in-process threads)"
    )
    frac_bits: int = Field(
        16, ge=8, le=24, description="2PC fixed-point fractional bits f (paper: 13)"
    )
    comparison: Literal["real", "ideal"] = Field(
        "real", description="2PC SecGE: real GMW circuit, or ideal functionality (cost sweeps)"
    )
    mpc_seed: int | None = Field(
        0, ge=0, description="2PC dealer and client-mask seed (in-process); None: fresh"
    )
    mpc_timeout_seconds: float = Field(120.0, gt=0, le=86_400, description="2PC receive timeout")
    norm_range: tuple[float, float] = Field(
        (1e-3, 1e3), description="public bounds on update norms: range hints of SecDiv / sqrt"
    )
    record_models: bool = Field(False, description="keep M_hat of every round (Theorem 1)")


def average_round_saving(requests: dict[int, int], num_rounds: int) -> tuple[float, dict]:
    """Return ARP = mean_j (T - T_r^j) / T * 100 and the per-client values (A25).

    Args:
        requests: Remaining client -> T_r^j, the rounds it was asked to train.
        num_rounds: T, the original number of rounds.
    """
    per_client = {c: (num_rounds - tr) / num_rounds * 100.0 for c, tr in sorted(requests.items())}
    mean = sum(per_client.values()) / len(per_client) if per_client else 100.0
    return mean, per_client


@dataclass(frozen=True)
class StarfishDetails(Details):
    """What ``starfish`` did.

    Attributes:
        backend: ``plain`` or ``mpc``.
        party: The 2PC party that produced this record (None on the mirror).
        precision: Arithmetic dtype of the mirror.
        units: ``gradient`` or ``delta`` (A1).
        unlearning_rate: η_u.
        round_selection: The SecRS method used.
        threshold_mode: ``td2`` or ``td1``.
        estimator: ``compact`` or ``two_loop``.
        num_selected: T'.
        selected_rounds: The replayed rounds, chronological.
        selection_ranking: All rounds by score, best first.
        correction_interval: T_c.
        warmup_rounds: K_w.
        correction_rounds: Rounds with SecTC checks.
        flags: Round -> flagged clients (recomputed exactly).
        exact_requests_per_client: T_r per client.
        arp: Average round saving, %.
        arp_per_client: Client -> round saving, %.
        exact_updates: Exact updates requested.
        estimated_updates: Updates estimated by SecUE.
        no_pair_requests: Client -> exact requests for lack of a curvature pair.
        pairs_pushed: Client -> curvature pairs pushed.
        guard_counts: How often each L-BFGS guard fired.
        rejected_updates: Exact uploads left out.
        stage_one: What Stage I shares (uploads, ring elements, bytes per server).
        opened: Every opening (phase, label, shape, small values).
        op_counts: Phase -> op -> calls, elements, comparisons.
        mpc_costs: Measured bytes, rounds and seconds per phase (2PC only).
        trajectory: M_hat after each replayed round (``record_models``).
        models_agree: Both 2PC servers opened the same model (in-process 2PC only).
        mpc_costs_party1: Party 1's measured costs (in-process 2PC only).
    """

    backend: str
    party: int | None
    precision: str
    units: str
    unlearning_rate: float
    round_selection: str
    threshold_mode: str
    estimator: str
    num_selected: int
    selected_rounds: tuple[int, ...]
    selection_ranking: tuple[int, ...]
    correction_interval: int
    warmup_rounds: int
    correction_rounds: tuple[int, ...]
    flags: dict[int, list[int]]
    exact_requests_per_client: dict[int, int]
    arp: float
    arp_per_client: dict[int, float]
    exact_updates: int
    estimated_updates: int
    no_pair_requests: dict[int, int]
    pairs_pushed: dict[int, int]
    guard_counts: dict[str, int]
    rejected_updates: tuple[dict[str, Any], ...]
    stage_one: dict[str, int]
    opened: tuple[dict[str, Any], ...]
    op_counts: dict[str, Any]
    mpc_costs: dict[str, Any] | None = field(default=None, compare=False)  # measured seconds
    trajectory: tuple[list[float], ...] | None = None
    models_agree: bool | None = None
    mpc_costs_party1: dict[str, Any] | None = field(default=None, compare=False)


@register("starfish")
class Starfish(Unlearner):
    """Starfish (Liu et al.): round selection, estimated replay, per-client threshold checks.

    Steps of ``_run``, in order: participants and stored updates checked; TD; SecRS; the replay
    of the selected rounds (warm-up, SecUE, SecTC, exact corrections, opened aggregate); ARP.

    ``UnlearnResult.details``: ``selected_rounds`` (chronological), ``selection_ranking``,
    ``num_selected`` (T'), ``correction_interval`` (T_c), ``warmup_rounds`` (K_w),
    ``correction_rounds``, ``flags`` (round -> flagged clients), ``exact_requests_per_client``
    (T_r), ``arp`` and ``arp_per_client`` (%), ``exact_updates``, ``estimated_updates``,
    ``no_pair_requests``, ``pairs_pushed``, ``guard_counts``, ``rejected_updates``, ``opened``
    (every opening: phase, label, shape, small values), ``stage_one`` (shares each server holds),
    ``op_counts`` (phase -> op -> calls, elements, comparisons), the effective options, and
    ``trajectory`` (M_hat after each replayed round, as lists; small models) when
    ``record_models`` is set. Everything in ``details`` is JSON-ready.
    """

    params_type = StarfishParams
    required_policies = frozenset({"all"})

    def make_backend(self, context: UnlearnContext) -> StarfishBackend[Any]:
        """Return the arithmetic backend of ``params.backend``."""
        return PlainBackend(dtype=self._dtype(context))

    def _dtype(self, context: UnlearnContext) -> torch.dtype:
        if self.params.precision == "model":
            return context.initial_params.dtype
        return torch.float64

    def selection_method(self, num_rounds: int) -> SelectionMethod:
        """Return the SecRS method used for a run of ``num_rounds`` rounds."""
        choice = self.params.round_selection
        if choice == "auto":
            return "method1" if num_rounds < switching_threshold() else "method2"
        return choice

    def _participants(
        self, context: UnlearnContext, forget: frozenset[int]
    ) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
        """Return round -> remaining participants and round -> targets; check stored updates."""
        history = context.history
        rounds = set(history.rounds())
        missing_rounds = sorted(set(range(context.num_rounds + 1)) - rounds)
        if missing_rounds:
            raise UnsupportedHistoryError(
                f"starfish needs the global model of every round 0..{context.num_rounds}; "
                f"rounds {missing_rounds[:10]} are not in the history. Complete the run first."
            )
        remaining = set(context.clients.ids)
        participants: dict[int, list[int]] = {}
        targets: dict[int, list[int]] = {}
        missing: list[tuple[int, int]] = []
        for r in range(1, context.num_rounds + 1):
            accepted = sorted(
                rec.client_id for rec in history.client_records(r) if rec.status == "accepted"
            )
            missing += [(r, c) for c in accepted if not history.has_update(r, c)]
            participants[r] = [c for c in accepted if c in remaining]
            targets[r] = [c for c in accepted if c in forget]
        if missing:
            shown = ", ".join(f"round {r} client {c}" for r, c in missing[:5])
            raise UnsupportedHistoryError(
                f"starfish needs every client's stored update (Stage I shares); {len(missing)} "
                f"are missing ({shown}{', ...' if len(missing) > 5 else ''}). Record with "
                "history.policy=all and keep the updates."
            )
        return participants, targets

    def scale(self, lr: float) -> float:
        """Return the update units' factor, G = scale * delta (A1)."""
        return -1.0 / lr if self.params.units == "gradient" else -1.0

    def _run(self, request: UnlearnRequest, context: UnlearnContext) -> RunOutput:
        if self.params.backend == "mpc":
            from fedunlearn.unlearn.starfish.deploy.servers import (
                run_in_process,  # imports this module
            )

            return run_in_process(self, request, context)
        backend = self.make_backend(context)
        scale = self.scale(context.clients.spec.lr)
        dtype = self._dtype(context)
        record = StageOneRecord(context.history, backend, scale, self.params.tolerance_rate, dtype)
        gateway = LocalClients(context, backend, scale, dtype)
        return self.replay(request, context, backend, record, gateway)

    def replay(
        self,
        request: UnlearnRequest,
        context: UnlearnContext,
        backend: StarfishBackend[Any],
        record: Any,
        gateway: ClientGateway,
    ) -> RunOutput:
        """Run Stage II (TD, SecRS, the replay, ARP) on ``backend``; the loop of spec §5.6.

        Args:
            request: Who to forget.
            context: The run (or a server's share store and public data).
            backend: The arithmetic (plain mirror or one server's 2PC backend).
            record: Stage I record (``StageOneRecord`` or a server's ``SharedStageOneRecord``).
            gateway: Where exact updates come from, as secrets.

        Returns:
            M_hat, the per-round metrics and ``StarfishDetails``.
        """
        p = self.params
        history, meter, clients = context.history, context.meter, context.clients
        num_rounds = context.num_rounds
        participants, targets_of_round = self._participants(context, request.forget)
        aggregator = context.training.aggregator
        if aggregator != "fedavg":
            warnings.warn(
                f"starfish aggregates with FedAvg (SecAdd_A); this run used {aggregator!r}",
                stacklevel=3,
            )
        dtype = getattr(record, "dtype", torch.float64)
        lr = clients.spec.lr
        eta_l = lr if p.units == "gradient" else 1.0
        eta_u = p.unlearning_rate if p.unlearning_rate is not None else eta_l
        rounds_of_client = {
            c: [r for r in range(1, num_rounds + 1) if c in participants[r]] for c in clients.ids
        }

        # Step 1: TD (spec §5.2).
        with backend.phase("TD"):
            if p.threshold_mode == "td2":
                thresholds = thresholds_td2(backend, record, rounds_of_client)
            else:
                shared = threshold_td1(
                    backend, record, participants, p.tolerance_rate, clients.num_params
                )
                thresholds = {c: shared for c in clients.ids}

        # Step 2: SecRS (spec §5.3); replay chronologically (A4).
        num_selected = math.ceil(p.selection_rate * num_rounds)
        method = self.selection_method(num_rounds)
        with backend.phase("RS"):
            ranking = select_rounds(
                backend,
                record,
                history.read_model,
                targets_of_round,
                num_selected,
                method,
                p.norm_range,
            )
        rounds = sorted(ranking)
        interval = math.ceil(p.interval_rate * num_rounds)
        warmup = p.buffer_size if p.warmup_rounds is None else p.warmup_rounds
        last_estimating = len(rounds) - p.final_rounds  # selected rounds k > this are exact
        counts = GuardCounts()

        # Step 3: replay (spec §5.6).
        replay = _Replay(
            context=context,
            backend=backend,
            record=record,
            thresholds=thresholds,
            participants=participants,
            dtype=dtype,
            gateway=gateway,
            eta_u=eta_u,
            estimator=p.estimator,
            warmup=warmup,
            last_estimating=last_estimating,
            interval=interval,
            correct_on=p.correction_index,
            buffers={
                c: CurvatureBuffer(p.buffer_size, counts, p.curvature_check) for c in clients.ids
            },
            requests=Counter({c: 0 for c in clients.ids}),
        )
        trajectory: list[torch.Tensor] = []
        rows: list[dict[str, float]] = []
        m_hat = history.read_model(0)
        for k, r in enumerate(rounds, start=1):
            m_hat = replay.round(k, r, m_hat)
            meter.rounds += 1
            log.info("replayed round %d (%d of %d)", r, k, len(rounds))
            if p.record_models:
                trajectory.append(m_hat.clone())
            row: dict[str, float] = {"round": r}
            if context.evaluate is not None:
                row.update(context.evaluate(m_hat))
            rows.append(row)

        requests = replay.requests
        arp, arp_per_client = average_round_saving(dict(requests), num_rounds)
        # Stage I (spec §4.1, §7): per stored upload, m + 2 shared ring elements per server.
        uploads = sum(len(participants[r]) + len(targets_of_round[r]) for r in participants)
        shared_elements = uploads * (clients.num_params + 2)
        cost_summary = getattr(backend, "cost_summary", None)
        details = StarfishDetails(
            backend=p.backend,
            party=getattr(getattr(backend, "party", None), "party_id", None),
            precision=str(dtype).removeprefix("torch."),
            units=p.units,
            unlearning_rate=eta_u,
            round_selection=method,
            threshold_mode=p.threshold_mode,
            estimator=p.estimator,
            num_selected=num_selected,
            selected_rounds=tuple(rounds),
            selection_ranking=tuple(ranking),
            correction_interval=interval,
            warmup_rounds=min(warmup, len(rounds)),
            correction_rounds=tuple(sorted(replay.flags)),
            flags=replay.flags,
            exact_requests_per_client=dict(sorted(requests.items())),
            arp=arp,
            arp_per_client=arp_per_client,
            exact_updates=sum(requests.values()),
            estimated_updates=replay.estimated,
            no_pair_requests={c: replay.no_pair[c] for c in clients.ids},
            pairs_pushed={c: replay.buffers[c].pushed for c in clients.ids},
            guard_counts=counts.to_dict(),
            rejected_updates=tuple(replay.rejected),
            stage_one={
                "shared_uploads": uploads,
                "shared_elements": shared_elements,
                "bytes_per_server": shared_elements * 8,  # Z_{2^64}
            },
            opened=tuple(o.to_dict() for o in backend.opened),
            op_counts=backend.op_counts,
            # a 2PC backend: measured bytes, rounds, seconds per phase
            mpc_costs=cost_summary() if cost_summary is not None else None,
            trajectory=tuple(m.tolist() for m in trajectory) if p.record_models else None,
        )
        return RunOutput(m_hat, rows, details)


class ClientGateway(Protocol):
    """Where Stage II's exact updates come from: the remaining clients, as secrets."""

    def exact(
        self, m_hat: torch.Tensor, client_ids: list[int], round_: int
    ) -> tuple[dict[int, Any], dict[int, str]]:
        """Return (client -> shared exact update at ``m_hat``, client -> rejection reason)."""
        ...


class LocalClients:
    """Exact updates from the run's federation in this process, shared with ``backend.share``.

    Args:
        context: The run (its remaining clients train with round r's seeds, A12).
        backend: Where the client's SecShare is made.
        scale: Update units, G = scale * delta.
        dtype: Working dtype of the shared value.
    """

    def __init__(
        self,
        context: UnlearnContext,
        backend: StarfishBackend[Any],
        scale: float,
        dtype: torch.dtype,
    ) -> None:
        self.context, self.backend, self.scale, self.dtype = context, backend, scale, dtype

    def exact(
        self, m_hat: torch.Tensor, client_ids: list[int], round_: int
    ) -> tuple[dict[int, Any], dict[int, str]]:
        """Train the clients at ``m_hat``, screen the uploads as training does, share them."""
        shares: dict[int, Any] = {}
        rejected: dict[int, str] = {}
        for update in self.context.clients.train(m_hat, client_ids, round_):
            reason = screen_update(update, self.context.clients.num_params)
            if reason is not None:
                rejected[update.client_id] = reason
                continue
            shares[update.client_id] = self.backend.share(update.delta.to(self.dtype) * self.scale)
        return shares, rejected


@dataclass
class _Replay:
    """Step 3's state: buffers and bookkeeping, and one replayed round (spec §5.6 loop body).

    ``round`` runs, in order: warm-up or final rounds ask every participant for an exact update;
    other rounds estimate every participant's update (SecUE), run SecTC if it is a correction
    round and ask the flagged (and pair-less) clients; exact gradients are shared and pushed as
    curvature pairs while an estimated round is ahead; the FedAvg aggregate is opened and applied.
    """

    context: UnlearnContext
    backend: StarfishBackend[Any]
    record: StageOneRecord
    thresholds: dict[int, Any]
    participants: dict[int, list[int]]
    dtype: torch.dtype
    gateway: ClientGateway
    eta_u: float
    estimator: str
    warmup: int
    last_estimating: int
    interval: int
    correct_on: str
    buffers: dict[int, CurvatureBuffer]
    requests: Counter[int]
    no_pair: Counter[int] = field(default_factory=Counter)
    flags: dict[int, list[int]] = field(default_factory=dict)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    estimated: int = 0

    def round(self, k: int, r: int, m_hat: torch.Tensor) -> torch.Tensor:
        """Replay selected round ``k`` (original round ``r``) from ``m_hat``; return M_hat."""
        ids = self.participants[r]
        if not ids:
            log.warning("round %d: no remaining participant; model unchanged", r)
            return m_hat
        backend = self.backend
        v = m_hat.to(self.dtype) - self.context.history.read_model(r - 1).to(self.dtype)  # A5
        exact = k <= self.warmup or k > self.last_estimating
        stored: dict[int, Any] = {}
        estimates: dict[int, Any] = {}
        asked = set(ids) if exact else set()
        if not exact:
            with backend.phase("UE"):
                for cid in ids:
                    stored[cid] = self.record.update(r, cid)
                    try:
                        estimates[cid] = self._estimate(cid, stored[cid], v)
                    except NoCurvaturePairsError:
                        self.no_pair[cid] += 1
                        asked.add(cid)
            if (r if self.correct_on == "round" else k) % self.interval == 0 and estimates:
                with backend.phase("TC"):
                    flags = check_thresholds(backend, estimates, self.thresholds)
                self.flags[r] = sorted(c for c, flagged in flags.items() if flagged)
                for cid in self.flags[r]:
                    del estimates[cid]
                asked |= set(self.flags[r])
        exact_shares = self._exact(m_hat, sorted(asked), r)
        if k < self.last_estimating and self.last_estimating > self.warmup and exact_shares:
            self._push_pairs(exact_shares, stored, r, v, float(m_hat.norm()))
        self.estimated += len(estimates)
        self.context.meter.estimated_updates += len(estimates)
        contributions = {**estimates, **exact_shares}
        kept = [c for c in ids if c in contributions]
        if not kept:
            log.warning("round %d: every update was rejected; model unchanged", r)
            return m_hat
        # A2: FedAvg weights n_j over the round's remaining contributors (as fedavg computes them)
        weights = torch.tensor([float(self.context.clients.num_samples(c)) for c in kept])
        weights = weights.to(torch.float64)
        weights = weights / weights.sum()
        with backend.phase("AGG"):
            total = backend.weighted_sum([contributions[c] for c in kept], weights)
            aggregate = backend.reveal(total, "aggregate")
        # M_hat <- M_hat - eta_u G_hat^agg
        return m_hat - (aggregate * self.eta_u).to(m_hat.dtype)

    def _estimate(self, cid: int, g_old: Any, v: torch.Tensor) -> Any:
        """SecUE for one client (compact: G_r + B v; two_loop: H^{-1} G_r)."""
        if self.estimator == "compact":
            return self.buffers[cid].estimate_compact(self.backend, g_old, v)
        return self.buffers[cid].estimate_two_loop(self.backend, g_old)

    def _exact(self, m_hat: torch.Tensor, client_ids: Sequence[int], r: int) -> dict[int, Any]:
        """Ask clients for exact updates at M_hat with round r's seeds (A12), as secrets."""
        if not client_ids:
            return {}
        with self.backend.phase("EXACT"):
            out, rejected = self.gateway.exact(m_hat, list(client_ids), r)
        for cid in client_ids:
            self.requests[cid] += 1
        for cid, reason in sorted(rejected.items()):
            log.warning("round %d: rejected client %d: %s", r, cid, reason)
            self.rejected.append({"round": r, "client_id": cid, "reason": reason})
        return out

    def _push_pairs(
        self,
        exact_shares: dict[int, Any],
        stored: dict[int, Any],
        r: int,
        v: torch.Tensor,
        model_norm: float,
    ) -> None:
        """Push (v, [G_bar] - [G_r]) into each recomputing client's FIFO (A8)."""
        if not float(v.to(torch.float64).norm()) > DEGENERATE_STEP_RTOL * (1.0 + model_norm):
            for cid in exact_shares:  # A9: ||v|| ~ 0 gives no pair
                self.buffers[cid].counts.degenerate_step += 1
            return
        with self.backend.phase("UE"):
            for cid, g_bar in exact_shares.items():
                g_old = stored[cid] if cid in stored else self.record.update(r, cid)
                self.buffers[cid].push(self.backend, v, self.backend.sub(g_bar, g_old), model_norm)
