"""Expected cost of requests: one client, w clients, s samples, and n requests in sequence."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fedunlearn.runs.plan.formulas import (
    expected_recomputed_rounds,
    hypergeometric,
    recompute_probability,
)
from fedunlearn.runs.plan.inputs import PlanInputs

__all__ = [
    "BYTES_PER_PARAM",
    "RequestCost",
    "SequenceCost",
    "batch_break_even",
    "client_request",
    "sample_request",
    "sequential_requests",
]

BYTES_PER_PARAM = 4  # float32 models on the wire
SAVING_FLOOR = 0.9  # "one request saves less than 10 % of Retrain"
_TOO_MANY_CLIENTS = "a request forgets 1..{top} clients (one remains); got {count}"
_TOO_MANY_REQUESTS = "requests must be in 1..{top} (one client remains); got {count}"


# ----- one request -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestCost:
    """The expected cost of one request processed after round ``after_round``.

    Attributes:
        kind: ``client`` (w random clients at once) or ``sample`` (s samples of one client).
        items: w, or s.
        after_round: r_u.
        round_probability: q (a mixture over shards and sample owners where they differ); None
            for w > 1 clients of a sharded run (they may fall in several shards).
        recompute_probability: P(recompute) (None where q is None).
        expected_rounds: E[recomputed rounds], summed over the shards that recompute.
        expected_trajectories: Expected client trajectories recomputed.
        retrain_trajectories: Retrain's expected client trajectories for the same request.
        cost_ratio: expected_trajectories / retrain_trajectories.
        expected_bytes: 2 model transfers per trajectory (None: model size unknown).
        rho: The request's nominal ρ (w ρ_C, or s ρ_S of the owner); None when undefined.
        bound_probability: The paper's bound min(1, ρ) on P(recompute) (Theorem 1).
    """

    kind: str
    items: int
    after_round: int
    round_probability: float | None
    recompute_probability: float | None
    expected_rounds: float
    expected_trajectories: float
    retrain_trajectories: float
    cost_ratio: float
    expected_bytes: float | None
    rho: float | None
    bound_probability: float | None


def _cost(
    inputs: PlanInputs,
    kind: str,
    items: int,
    r_u: int,
    parts: Sequence[tuple[float, float, float]],
    retrain: float,
    rho: float | None,
    mixed: bool = False,
) -> RequestCost:
    """Assemble a ``RequestCost`` from (weight, q, work per recomputed round) parts."""
    rounds = sum(w * expected_recomputed_rounds(q, r_u) for w, q, _ in parts)
    trajectories = sum(w * expected_recomputed_rounds(q, r_u) * work for w, q, work in parts)
    q_mix = None if mixed else sum(w * q for w, q, _ in parts)
    p_mix = None if mixed else sum(w * recompute_probability(q, r_u) for w, q, _ in parts)
    return RequestCost(
        kind=kind,
        items=items,
        after_round=r_u,
        round_probability=q_mix,
        recompute_probability=p_mix,
        expected_rounds=rounds,
        expected_trajectories=trajectories,
        retrain_trajectories=retrain,
        cost_ratio=trajectories / retrain if retrain else 0.0,
        expected_bytes=(
            None
            if inputs.num_params is None
            else 2.0 * trajectories * inputs.num_params * BYTES_PER_PARAM
        ),
        rho=rho,
        bound_probability=None if rho is None else min(1.0, rho),
    )


def _request_round(
    inputs: PlanInputs, after_round: int | None, count: int, refusal: str
) -> tuple[int, int]:
    """Return (r_u, M) once ``count`` clients leave at least one (``refusal``: the error).

    ``refusal`` is formatted with ``top`` (M - 1) and ``count``.
    """
    r_u, m_all = inputs.request_round(after_round), inputs.num_clients
    if not 1 <= count < m_all:
        raise ValueError(refusal.format(top=m_all - 1, count=count))
    return r_u, m_all


def client_request(
    inputs: PlanInputs, clients: int = 1, after_round: int | None = None
) -> RequestCost:
    """Return the expected cost of forgetting ``clients`` random clients in one request.

    Raises:
        ValueError: ``clients`` is not in 1..M-1.
    """
    r_u, m_all = _request_round(inputs, after_round, clients, _TOO_MANY_CLIENTS)
    shards = inputs.shards()
    # (P(j of the w clients fall in shard s), q of j clients there, trajectories per round after)
    parts = [
        (
            hypergeometric(m_all, s.size, clients, j),
            inputs.round_probability(s, s.size, j),
            inputs.work(s, s.size - j),
        )
        for s in shards
        for j in range(1, min(clients, s.size) + 1)
    ]
    return _cost(
        inputs,
        "client",
        clients,
        r_u,
        parts,
        inputs.retrain_work(r_u, clients),
        clients * inputs.rho_client(r_u),
        mixed=len(shards) > 1 and clients > 1,
    )


def sample_request(
    inputs: PlanInputs,
    client: int | None = None,
    samples: int = 1,
    after_round: int | None = None,
) -> RequestCost:
    """Return the expected cost of deleting ``samples`` samples of one client (it stays).

    Args:
        inputs: The plan's inputs.
        client: Whose samples; None: the owner of a uniformly random sample (clients weighted
            by N_k; the figures are averages over owners).
        samples: s, deleted together in one request.
        after_round: r_u (default R).
    """
    r_u = inputs.request_round(after_round)
    owners = list(range(inputs.num_clients)) if client is None else [client]
    total = sum(inputs.client_sizes[k] for k in owners)
    parts, rho = [], 0.0
    for k in owners:
        shard = inputs.shard_of_client(k)
        q = inputs.round_probability(shard, shard.size) * inputs.sample_use(k, samples)
        parts.append((inputs.client_sizes[k] / total, q, inputs.work(shard, shard.size)))
        rho_k = inputs.rho_sample(k, r_u)
        rho += (inputs.client_sizes[k] / total) * samples * (rho_k or 0.0)
    return _cost(
        inputs,
        "sample",
        samples,
        r_u,
        parts,
        inputs.retrain_work(r_u),
        rho if inputs.local_steps is not None else None,
    )


def batch_break_even(inputs: PlanInputs, after_round: int | None = None) -> int | None:
    """Return the fewest clients w in one request that save less than 10 % of Retrain.

    The cost ratio grows with w (more clients, an earlier first use), so this bisects.
    """
    r_u = inputs.request_round(after_round)
    low, high = 1, inputs.num_clients - 1
    if client_request(inputs, high, r_u).cost_ratio < SAVING_FLOOR:
        return None
    while low < high:
        mid = (low + high) // 2
        if client_request(inputs, mid, r_u).cost_ratio >= SAVING_FLOOR:
            high = mid
        else:
            low = mid + 1
    return low


# ----- sequences ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SequenceCost:
    """n single-client requests served one at a time, each on the run the previous one left.

    Attributes:
        requests: n.
        recompute_probabilities: p_j of each request (M one smaller each time, K frozen).
        expected_recomputations: Σ p_j.
        expected_rounds: Σ E[recomputed rounds]_j.
        expected_trajectories: Σ of the requests' expected trajectories.
        retrain_trajectories: Σ of Retrain's, one Retrain per request.
        cost_ratio: expected_trajectories / retrain_trajectories.
        bound_recomputations: The paper's bound 4 n min(1, ρ_C) (§5.3.1).
        break_even: n*, the fewest requests whose one-at-a-time expected cost reaches that of one
            Retrain removing them all together; None if no n < M does.
    """

    requests: int
    recompute_probabilities: tuple[float, ...]
    expected_recomputations: float
    expected_rounds: float
    expected_trajectories: float
    retrain_trajectories: float
    cost_ratio: float
    bound_recomputations: float
    break_even: int | None


def sequential_requests(
    inputs: PlanInputs, requests: int, after_round: int | None = None
) -> SequenceCost:
    """Return the expected cost of ``requests`` single-client requests served one at a time.

    Each request forgets a uniformly random remaining client after round r_u (of the lineage
    the previous request left, which has the law of training without the clients gone). K and
    each shard's K_s stay frozen. With shards, each shard loses clients in proportion to its
    size (an expectation over which shard each request hits; exact with one shard).

    Raises:
        ValueError: ``requests`` is not in 1..M-1.
    """
    r_u, m_all = _request_round(inputs, after_round, requests, _TOO_MANY_REQUESTS)
    shards = inputs.shards()
    current = [float(s.size) for s in shards]
    probabilities: list[float] = []
    rounds = trajectories = retrain = spent = 0.0
    break_even: int | None = None
    for j in range(1, m_all):
        total = sum(current)
        after = [c - c / total for c in current]
        cost = _cost(
            inputs,
            "client",
            1,
            r_u,
            [
                (c / total, inputs.round_probability(s, c), inputs.work(s, a))
                for s, c, a in zip(shards, current, after, strict=True)
            ],
            r_u * sum(inputs.work(s, a) for s, a in zip(shards, after, strict=True)),
            None,
        )
        spent += cost.expected_trajectories
        if j <= requests:
            probabilities.append(cost.recompute_probability or 0.0)
            rounds += cost.expected_rounds
            trajectories += cost.expected_trajectories
            retrain += cost.retrain_trajectories
        if break_even is None and spent >= cost.retrain_trajectories:
            break_even = j  # one Retrain after the j-th removes all j at this cost
        if j >= requests and break_even is not None:
            break
        current = after
    return SequenceCost(
        requests=requests,
        recompute_probabilities=tuple(probabilities),
        expected_recomputations=sum(probabilities),
        expected_rounds=rounds,
        expected_trajectories=trajectories,
        retrain_trajectories=retrain,
        cost_ratio=trajectories / retrain if retrain else 0.0,
        bound_recomputations=4 * requests * min(1.0, inputs.rho_client(r_u)),
        break_even=break_even,
    )
