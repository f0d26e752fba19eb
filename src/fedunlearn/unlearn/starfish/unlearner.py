"""Starfish unlearning (Stage II): the ``starfish`` method, its details, and its runners.

The servers remove the targets from a finished run using what they hold after Stage I (every
client's update, its norm and its alpha-quantile threshold, as shares; the public global
models). ``Starfish.replay`` runs Stage II once, on one arithmetic backend:

1. TD (threshold determination, Sec. IV-C2): TD^2, per remaining client
   delta^j = SecMax_r delta_r^j (default), or TD^1, one FedRecover-style global threshold;
2. SecRS (Alg. 1): score every round by the cosine of the targets' update with the global
   update (SF2), open the top T' = ceil(sigma T) round indices, replay them chronologically (SF3);
3. the replay from M_0 (:class:`~fedunlearn.unlearn.starfish.replay.Replay`: warm-up, SecUE,
   SecTC, exact corrections, the opened FedAvg aggregate);
4. ARP = mean_j (T - T_r^j) / T * 100 (Sec. VI-A, SF15), the openings and the op counts.

The method's ``params`` (``StarfishParams``) hold the algorithm and its ``execution``
(``StarfishExecution``) how to run it. A *runner*, chosen by ``execution.backend`` from
``RUNNERS``, builds the backend, the Stage I record and the client gateway and calls
``replay``: ``plain`` (:func:`run_plain`, here) runs the float64 plaintext mirror;
``mpc`` (``deploy.servers.run_in_process``, which registers itself) runs the loop once per 2PC
server in two threads. ``fedunlearn starfish-local`` runs the servers as processes
(``deploy.remote``, ``deploy.launcher``). What the servers open is logged in
``details.opened`` (phase, label, shape); a 2PC run adds ``details.mpc_costs``.

Paper: Liu, Ye, Jiang, Shen, Guo, Tjuawinata, Lam, "Privacy-Preserving Federated Unlearning with
Certified Client Removal", Alg. 4 (Stage I and II), Sec. IV-D, Sec. VI-A (ARP).
Deviations: docs/methods/starfish.md, SF1 (units), SF2, SF3, SF12 (``round_selection="auto"``),
SF15, SF16 (participants: a remaining client takes part in round r iff its round-r update was
accepted; aggregation is always FedAvg), SF18 (the mirror derives Stage I's norms and
thresholds at unlearning time), SF21 (precision).
"""

from __future__ import annotations

import logging
import math
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import ValidationError

from fedunlearn.errors import ConfigError, UnknownNameError
from fedunlearn.linalg.lbfgs import GuardCounts
from fedunlearn.registry import Registry
from fedunlearn.unlearn.base import Details, RunOutput, Unlearner, UnlearnRequest
from fedunlearn.unlearn.complete_history import refuse_missing_updates, require_every_round
from fedunlearn.unlearn.context import UnlearnContext
from fedunlearn.unlearn.registry import register
from fedunlearn.unlearn.starfish.backend.plain import PlainBackend
from fedunlearn.unlearn.starfish.backend.protocol import StarfishBackend
from fedunlearn.unlearn.starfish.params import StarfishExecution, StarfishParams, split_options
from fedunlearn.unlearn.starfish.replay import ClientGateway, LocalClients, Replay
from fedunlearn.unlearn.starfish.steps import (
    CurvatureBuffer,
    SelectionMethod,
    StageOneRecord,
    StageOneShares,
    select_rounds,
    switching_threshold,
    threshold_td1,
    thresholds_td2,
)

__all__ = [
    "ASSUMPTIONS",
    "RUNNERS",
    "Runner",
    "Starfish",
    "StarfishDetails",
    "average_round_saving",
    "run_plain",
]

log = logging.getLogger(__name__)

ASSUMPTIONS: dict[str, str] = {
    # every 2PC result (in-process and deployed): the paper's Sec. III-B, docs/security.md
    "semi_honest": (
        "threat model: semi-honest servers: a server that alters its shares (or a value it "
        "opens) is not detected, and both servers then open the same wrong model; the two "
        "servers never collude; the dealer is trusted and colludes with no server "
        "(docs/security.md)"
    ),
    "plaintext": (
        "plaintext mirror: one process computes on every client's update in the clear; no "
        "secret sharing, no privacy between servers"
    ),
    "in_process": (
        "in-process 2PC simulation: both servers and the dealer run in one process (dealer "
        "material from one seed): correct arithmetic, not a secure deployment"
    ),
    "simulated_clients": (
        "simulated clients: one process holds every remaining client's data and trains their "
        "exact updates (docs/methods/starfish.md, SF24)"
    ),
}
"""What a Starfish result rests on, by key (``StarfishDetails.assumptions`` holds the texts)."""


def average_round_saving(requests: dict[int, int], num_rounds: int) -> tuple[float, dict]:
    """Return ARP = mean_j (T - T_r^j) / T * 100 and the per-client values (Sec. VI-A, SF15).

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
        units: ``gradient`` or ``delta`` (SF1).
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
        servers_opened_same_model: Both 2PC servers opened the same model (in-process 2PC;
            ``starfish-local`` adds it to its result). It shows that the two servers' runs
            stayed consistent (no desynchronised or failed opening), **not** that the model
            is right: a server that alters its shares makes both open the same altered model
            (``assumptions``). Called ``models_agree`` before issue 41.
        mpc_costs_party1: Party 1's measured costs (in-process 2PC only).
        assumptions: What the result rests on that no check sees (``ASSUMPTIONS``): the
            threat model of 2PC ("semi-honest servers: a server that alters its shares is
            not detected"), or that the plaintext mirror has none; the receipt carries them.
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
    servers_opened_same_model: bool | None = None
    mpc_costs_party1: dict[str, Any] | None = field(default=None, compare=False)
    assumptions: tuple[str, ...] = ()


@register("starfish")
class Starfish(Unlearner[StarfishParams]):
    """Starfish (Liu et al.): round selection, estimated replay, per-client threshold checks.

    Steps of ``replay``, in order: participants and stored updates checked; TD; SecRS; the
    replay of the selected rounds (warm-up, SecUE, SecTC, exact corrections, opened aggregate);
    ARP. ``_run`` hands the work to the runner of ``execution.backend``.

    Args:
        params: The algorithm (``StarfishParams``), or one flat mapping of options: its
            ``StarfishExecution`` keys (``backend``, ``frac_bits``, ``mpc_seed``...) become
            the execution, so ``make_method("starfish", {"backend": "mpc"})`` and the CLI's
            ``--param backend=mpc`` work.
        execution: How to run it (``StarfishExecution`` or a mapping); default: the plaintext
            mirror. Give execution options here or in ``params``, not in both.

    Raises:
        ConfigError: An option is unknown or out of range, or execution options were given
            twice.
    """

    params_type = StarfishParams
    execution_type = StarfishExecution
    required_policies = frozenset({"all"})
    params: StarfishParams

    def __init__(
        self,
        params: StarfishParams | Mapping[str, Any] | None = None,
        execution: StarfishExecution | Mapping[str, Any] | None = None,
    ) -> None:
        if params is not None and not isinstance(params, StarfishParams):
            params, flat = split_options(params)
            if flat and execution is not None:
                raise ConfigError(
                    f"starfish got execution options both in its parameters ({sorted(flat)}) "
                    "and as 'execution'; give them in one place"
                )
            execution = flat if execution is None else execution
        super().__init__(params)
        self.execution = _validated_execution(execution)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params!r}, {self.execution!r})"

    def options(self) -> dict[str, Any]:
        """Return the options given explicitly, algorithm and execution, as one flat dict."""
        return {
            **self.params.model_dump(exclude_unset=True),
            **self.execution.model_dump(exclude_unset=True),
        }

    def make_backend(self, context: UnlearnContext) -> StarfishBackend[Any]:
        """Return the plaintext mirror the ``plain`` runner computes on."""
        return PlainBackend(dtype=self.working_dtype(context))

    def working_dtype(self, context: UnlearnContext) -> torch.dtype:
        """Return the mirror's dtype: float64, or the run's with ``precision="model"`` (SF21)."""
        if self.execution.precision == "model":
            return context.initial_params.dtype
        return torch.float64

    def selection_method(self, num_rounds: int) -> SelectionMethod:
        """Return the SecRS method used for a run of ``num_rounds`` rounds (SF12)."""
        choice = self.params.round_selection
        if choice == "auto":
            return "method1" if num_rounds < switching_threshold() else "method2"
        return choice

    def _participants(
        self, context: UnlearnContext, forget: frozenset[int]
    ) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
        """Return round -> remaining participants and round -> targets; check stored updates."""
        history = context.history
        require_every_round(context, "starfish")
        remaining = set(context.clients.client_ids)
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
        refuse_missing_updates(
            missing, "starfish needs every client's stored update (Stage I shares)"
        )
        return participants, targets

    def scale(self, lr: float) -> float:
        """Return the update units' factor, G = scale * delta (SF1)."""
        return -1.0 / lr if self.params.units == "gradient" else -1.0

    def _run(self, request: UnlearnRequest, context: UnlearnContext) -> RunOutput:
        return RUNNERS.get(self.execution.backend)(self, request, context)

    def _thresholds(
        self,
        backend: StarfishBackend[Any],
        record: StageOneShares,
        participants: dict[int, list[int]],
        context: UnlearnContext,
    ) -> dict[int, Any]:
        """Per-client thresholds delta^j: TD^2 (Sec. IV-C2), or one shared TD^1 (SF10)."""
        clients, p = context.clients, self.params
        if p.threshold_mode == "td2":
            rounds_of_client = {
                c: [r for r in range(1, context.num_rounds + 1) if c in participants[r]]
                for c in clients.client_ids
            }
            return thresholds_td2(backend, record, rounds_of_client)
        shared = threshold_td1(backend, record, participants, p.tolerance_rate, clients.num_params)
        return {c: shared for c in clients.client_ids}

    def _details(
        self,
        replay: Replay,
        counts: GuardCounts,
        selection: tuple[SelectionMethod, int, list[int], list[int]],
        targets_of_round: Mapping[int, Any],
        trajectory: tuple[Any, ...] | None,
    ) -> StarfishDetails:
        """What the replay did and cost: ``StarfishDetails``.

        ``selection`` is SecRS's (method, number selected, ranking, rounds in replay order).
        """
        p, e = self.params, self.execution
        method, num_selected, ranking, rounds = selection
        backend, participants = replay.backend, replay.participants
        client_ids, num_params = (
            replay.context.clients.client_ids,
            replay.context.clients.num_params,
        )
        requests = replay.requests
        arp, arp_per_client = average_round_saving(dict(requests), replay.context.num_rounds)
        # Stage I (Alg. 4 lines 1-9, Sec. V-B): per stored upload, m + 2 ring elements per server.
        uploads = sum(len(participants[r]) + len(targets_of_round[r]) for r in participants)
        shared_elements = uploads * (num_params + 2)
        cost_summary = getattr(backend, "cost_summary", None)
        return StarfishDetails(
            backend=e.backend,
            party=getattr(getattr(backend, "party", None), "party_id", None),
            precision=str(replay.dtype).removeprefix("torch."),
            units=p.units,
            unlearning_rate=replay.eta_u,
            round_selection=method,
            threshold_mode=p.threshold_mode,
            estimator=p.estimator,
            num_selected=num_selected,
            selected_rounds=tuple(rounds),
            selection_ranking=tuple(ranking),
            correction_interval=replay.interval,
            warmup_rounds=min(replay.warmup, len(rounds)),
            correction_rounds=tuple(sorted(replay.flags)),
            flags=replay.flags,
            exact_requests_per_client=dict(sorted(requests.items())),
            arp=arp,
            arp_per_client=arp_per_client,
            exact_updates=sum(requests.values()),
            estimated_updates=replay.estimated,
            no_pair_requests={c: replay.no_pair[c] for c in client_ids},
            pairs_pushed={c: replay.buffers[c].pushed for c in client_ids},
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
            trajectory=trajectory,
            assumptions=(ASSUMPTIONS["plaintext" if e.backend == "plain" else "semi_honest"],),
        )

    def replay(
        self,
        request: UnlearnRequest,
        context: UnlearnContext,
        backend: StarfishBackend[Any],
        record: StageOneShares,
        gateway: ClientGateway,
    ) -> RunOutput:
        """Run Stage II (TD, SecRS, the replay, ARP) on ``backend`` (the module's steps 1-4).

        Args:
            request: Who to forget.
            context: The run (or a server's share store and public data).
            backend: The arithmetic (plain mirror or one server's 2PC backend).
            record: Stage I record (``StageOneRecord`` or a server's ``SharedStageOneRecord``).
            gateway: Where exact updates come from, as secrets.

        Returns:
            M_hat, the per-round metrics and ``StarfishDetails``.
        """
        p, e = self.params, self.execution
        history, clients = context.history, context.clients
        num_rounds = context.num_rounds
        participants, targets_of_round = self._participants(context, request.forget)
        aggregator = context.training.aggregator
        if aggregator != "fedavg":
            warnings.warn(
                f"starfish aggregates with FedAvg (SecAdd_A); this run used {aggregator!r}",
                stacklevel=3,
            )
        dtype = record.dtype
        lr = clients.spec.lr
        eta_l = lr if p.units == "gradient" else 1.0
        eta_u = p.unlearning_rate if p.unlearning_rate is not None else eta_l

        # Step 1: TD (Sec. IV-C2; TD^1 for comparison, SF10).
        with backend.phase("TD"):
            thresholds = self._thresholds(backend, record, participants, context)

        # Step 2: SecRS (Alg. 1); replay chronologically (SF3).
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
                e.norm_range,
            )
        rounds = sorted(ranking)
        interval = math.ceil(p.interval_rate * num_rounds)
        warmup = p.buffer_size if p.warmup_rounds is None else p.warmup_rounds
        last_estimating = len(rounds) - p.final_rounds  # selected rounds k > this are exact
        counts = GuardCounts()

        # Step 3: the replay (replay.Replay).
        replay = Replay(
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
                c: CurvatureBuffer(p.buffer_size, counts, p.curvature_check)
                for c in clients.client_ids
            },
            requests=Counter({c: 0 for c in clients.client_ids}),
        )
        trajectory: list[torch.Tensor] = []
        rows: list[dict[str, float]] = []
        m_hat = context.start_from(0)
        for k, r in enumerate(rounds, start=1):
            with backend.round_scope(replay.kind(k, r)):
                m_hat = replay.round(k, r, m_hat)
            log.info("replayed round %d (%d of %d)", r, k, len(rounds))
            if e.record_models:
                trajectory.append(m_hat.clone())
            rows.append(context.end_round(r, m_hat))

        details = self._details(
            replay,
            counts,
            (method, num_selected, ranking, rounds),
            targets_of_round,
            tuple(m.tolist() for m in trajectory) if e.record_models else None,
        )
        return RunOutput(m_hat, rows, details)


def _validated_execution(
    execution: StarfishExecution | Mapping[str, Any] | None,
) -> StarfishExecution:
    """Return ``execution`` as a ``StarfishExecution``; one ``ConfigError`` lists every problem."""
    if isinstance(execution, StarfishExecution):
        return execution
    try:
        return StarfishExecution.model_validate(dict(execution or {}))
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']} (got {e.get('input')!r})"
            for e in err.errors()
        )
        raise ConfigError(f"invalid parameters for method 'starfish': {problems}") from None


Runner = Callable[[Starfish, UnlearnRequest, UnlearnContext], RunOutput]
"""Runs Stage II for a method on one backend: builds backend, record, gateway; calls replay."""

RUNNERS: Registry[Runner] = Registry(
    "starfish backend",
    UnknownNameError,
    lazy={"mpc": "fedunlearn.unlearn.starfish.deploy.servers:run_in_process"},
)
"""``execution.backend`` -> its runner; ``mpc`` (``deploy.servers``) is imported when first used."""


@RUNNERS.register("plain")
def run_plain(method: Starfish, request: UnlearnRequest, context: UnlearnContext) -> RunOutput:
    """Run Stage II on the plaintext mirror (``method.make_backend``) in this process."""
    backend = method.make_backend(context)
    scale = method.scale(context.clients.spec.lr)
    dtype = method.working_dtype(context)
    record = StageOneRecord(context.history, backend, scale, method.params.tolerance_rate, dtype)
    gateway = LocalClients(context, backend, scale, dtype)
    return method.replay(request, context, backend, record, gateway)
