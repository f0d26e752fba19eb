"""The whole plan of a config, and what a trained run realised (``fedunlearn info``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from fedunlearn.history.policy import record_multiplicity
from fedunlearn.runs.plan.costs import (
    BYTES_PER_PARAM,
    RequestCost,
    SequenceCost,
    batch_break_even,
    client_request,
    sample_request,
    sequential_requests,
)
from fedunlearn.runs.plan.inputs import PlanInputs

if TYPE_CHECKING:
    from fedunlearn.config import RunConfig
    from fedunlearn.history.store import HistoryReader

__all__ = ["Plan", "deletion_readiness", "plan_deletions", "readiness_from_first_rounds"]


# ----- the whole plan ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """The planner's answer for a config: parameters, ρ, and the expected cost of requests.

    Attributes:
        sampling: ``tv_stable`` or ``fraction``.
        num_clients: M.
        shards: S.
        draws_per_round: K (summed over shards), or n under fraction sampling.
        local_steps: E (None under fraction sampling).
        batch_size: b.
        rounds: R.
        after_round: r_u, the round after which requests are processed.
        distinct_per_round: Expected client trajectories per round (all shards).
        model_bytes: Bytes of one model transfer (None: unknown).
        rho_client: Nominal ρ_C = K r_u / M.
        rho_sample_worst: The largest ρ_S,k, and its client (None without E).
        worst_client: The client of ``rho_sample_worst``.
        client: One random client.
        sample: One sample of a random owner (clients weighted by N_k).
        sample_worst: One sample of ``worst_client``.
        batch: ``batch_clients`` random clients in one request.
        sequence: ``requests`` single-client requests one at a time.
        batch_break_even: The fewest clients in one request that save < 10 % of Retrain.
        tv_stable_client: For a fraction config: one client under ``tv_stable`` sampling with the
            same participation, to compare.
        tv_stable_draws: That comparison's K = max(1, round(p M)).
    """

    sampling: str
    num_clients: int
    shards: int
    draws_per_round: int
    local_steps: int | None
    batch_size: int
    rounds: int
    after_round: int
    distinct_per_round: float
    model_bytes: int | None
    rho_client: float
    rho_sample_worst: float | None
    worst_client: int
    client: RequestCost
    sample: RequestCost
    sample_worst: RequestCost
    batch: RequestCost
    sequence: SequenceCost
    batch_break_even: int | None
    tv_stable_client: RequestCost | None
    tv_stable_draws: int | None

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready values."""
        return asdict(self)


def plan_deletions(
    inputs: PlanInputs,
    *,
    requests: int = 1,
    batch_clients: int = 10,
    samples: int = 1,
    after_round: int | None = None,
) -> Plan:
    """Return the plan of ``inputs``: ρ, one request of each kind, a batch, a sequence.

    Args:
        inputs: The run's planner inputs.
        requests: n, single-client requests served one at a time (clipped to M-1).
        batch_clients: w, clients forgotten in one request (clipped to M-1).
        samples: s, samples of one client deleted in one request.
        after_round: r_u (default R: requests after training).
    """
    r_u = inputs.request_round(after_round)
    m = inputs.num_clients
    worst = inputs.worst_client()
    tv, tv_draws = None, None
    if not inputs.tv_stable:
        as_tv = replace(inputs, sampling="tv_stable", local_steps=1)
        tv, tv_draws = client_request(as_tv, 1, r_u), as_tv.draws_per_round()
    return Plan(
        sampling=inputs.sampling,
        num_clients=m,
        shards=len(inputs.shards()),
        draws_per_round=inputs.draws_per_round(),
        local_steps=inputs.local_steps,
        batch_size=inputs.batch_size,
        rounds=inputs.rounds,
        after_round=r_u,
        distinct_per_round=inputs.retrain_work(1),
        model_bytes=None if inputs.num_params is None else inputs.num_params * BYTES_PER_PARAM,
        rho_client=inputs.rho_client(r_u),
        rho_sample_worst=inputs.rho_sample(worst, r_u),
        worst_client=worst,
        client=client_request(inputs, 1, r_u),
        sample=sample_request(inputs, None, samples, r_u),
        sample_worst=sample_request(inputs, worst, samples, r_u),
        batch=client_request(inputs, min(batch_clients, m - 1), r_u),
        sequence=sequential_requests(inputs, min(requests, m - 1), r_u),
        batch_break_even=batch_break_even(inputs, r_u),
        tv_stable_client=tv,
        tv_stable_draws=tv_draws,
    )


# ----- what a trained run realised ---------------------------------------------------------------


def readiness_from_first_rounds(
    first_round: Mapping[int, int | None],
    draws: int,
    rounds: int,
    predicted: RequestCost | None = None,
) -> dict[str, Any]:
    """Return the realised cost of a request for each client, from its first drawn round.

    Args:
        first_round: Client -> the first round that drew it (None: never drawn).
        draws: Total draws (multiplicities summed) over the rounds.
        rounds: The rounds completed (a request now recomputes first..rounds).
        predicted: The planner's single-client request after ``rounds``, shown beside.
    """
    cost = {c: (rounds - f + 1 if f is not None else 0) for c, f in sorted(first_round.items())}
    never = sorted(c for c, f in first_round.items() if f is None)
    n = len(cost)
    return {
        "rounds": rounds,
        "clients": n,
        "never_drawn": never,
        "draws_per_client": draws / n if n else 0.0,
        "first_drawn_round": {str(c): f for c, f in sorted(first_round.items())},
        "rounds_to_recompute": {str(c): v for c, v in cost.items()},
        "recompute_rate": (n - len(never)) / n if n else 0.0,
        "mean_rounds_to_recompute": sum(cost.values()) / n if n else 0.0,
        "predicted": None if predicted is None else asdict(predicted),
    }


def deletion_readiness(
    history: HistoryReader, config: RunConfig, forgotten: frozenset[int] = frozenset()
) -> dict[str, Any] | None:
    """Return what a client request would recompute now, from the run's participation index.

    Reads each completed round's client records (any status) and their ``multiplicity``
    scalar, for the clients not ``forgotten``. The prediction beside is the planner's for the
    config's federation as trained (client sizes from the records; K and the shards as the
    config sets them, before any deletion). None for a run with no completed round.
    """
    rounds = [t for t in history.rounds() if t >= 1]
    if not rounds:
        return None
    everyone = range(config.data.num_clients)
    first: dict[int, int | None] = {c: None for c in everyone if c not in forgotten}
    sizes: dict[int, int] = {}
    draws = 0
    for t in rounds:
        for record in history.client_records(t):
            sizes.setdefault(record.client_id, record.num_samples)
            if record.client_id in first:
                draws += record_multiplicity(record)
                if first[record.client_id] is None:
                    first[record.client_id] = t
    predicted = None
    if len(everyone) >= 2:
        fill = max(sizes.values(), default=0) or config.training.batch_size
        inputs = PlanInputs.from_config(config, [sizes.get(c) or fill for c in everyone])
        predicted = client_request(inputs, 1, rounds[-1])
    return readiness_from_first_rounds(first, draws, rounds[-1], predicted)
