"""The deletion planner (``fedunlearn.runs.plan``): formulas, the spec's worked table, shards.

Each formula is checked against a brute-force enumeration of the sampler's law; the numbers of
the design note's worked table (FATS's MNIST setting: M=300, K=5, E=10, b=10, N=200) are
recomputed here.
"""

from __future__ import annotations

import itertools
import math

import pytest

from fedunlearn.config import parse_config
from fedunlearn.history.store import ClientRecord
from fedunlearn.runs.plan import (
    PlanInputs,
    client_request,
    client_round_probability,
    deletion_readiness,
    expected_distinct_clients,
    expected_recomputed_rounds,
    fraction_round_probability,
    plan_deletions,
    readiness_from_first_rounds,
    recompute_probability,
    sample_request,
    sample_use_probability,
    sequential_requests,
)
from fedunlearn.runs.setup import shard_plan

MNIST = PlanInputs(
    client_sizes=(200,) * 300,
    rounds=50,
    sampling="tv_stable",
    participation=5 / 300,
    batch_size=10,
    local_steps=10,
)


@pytest.mark.parametrize(
    ("after", "kind", "items", "p", "rounds"),
    [
        (30, "client", 1, 0.394, 6.6),
        (30, "sample", 1, 0.181, 2.9),
        (30, "client", 10, 0.994, 24.6),
        (50, "client", 1, 0.566, 16.4),
    ],
)
def test_the_spec_s_worked_table(after, kind, items, p, rounds):
    if kind == "client":
        cost = client_request(MNIST, items, after)
    else:
        cost = sample_request(MNIST, None, items, after)
    assert round(cost.recompute_probability, 3) == p
    assert round(cost.expected_rounds, 1) == rounds


def test_nominal_rho_of_the_spec():
    plan = plan_deletions(MNIST, after_round=30)
    assert plan.rho_client == pytest.approx(0.5)
    assert plan.rho_sample_worst == pytest.approx(0.25)
    assert plan.client.bound_probability == pytest.approx(0.5)
    assert plan.batch.rho == pytest.approx(5.0)
    assert plan.batch.bound_probability == 1.0
    assert plan.draws_per_round == 5
    assert plan.distinct_per_round == pytest.approx(300 * (1 - (299 / 300) ** 5))


def test_client_round_probability_is_the_law_of_k_draws_with_replacement():
    m, k = 5, 3
    tuples = list(itertools.product(range(m), repeat=k))
    for w in (1, 2, 4):
        hit = sum(1 for t in tuples if any(c < w for c in t)) / len(tuples)
        assert client_round_probability(m, k, w) == pytest.approx(hit)
    distinct = sum(len(set(t)) for t in tuples) / len(tuples)
    assert expected_distinct_clients(m, k) == pytest.approx(distinct)


def test_fraction_round_probability_is_the_law_of_a_subset_without_replacement():
    m, n = 7, 3
    subsets = list(itertools.combinations(range(m), n))
    for w in (1, 2, 5):
        hit = sum(1 for s in subsets if any(c < w for c in s)) / len(subsets)
        assert fraction_round_probability(m, n, w) == pytest.approx(hit)
    assert fraction_round_probability(m, m, 1) == 1.0


def test_sample_use_probability_is_the_law_of_e_fresh_batches():
    n, b, e = 6, 2, 2
    batches = list(itertools.combinations(range(n), b))
    plans = list(itertools.product(batches, repeat=e))
    for s in (1, 2):
        hit = sum(1 for p in plans if any(x < s for batch in p for x in batch)) / len(plans)
        assert sample_use_probability(n, b, e, s) == pytest.approx(hit)
    assert sample_use_probability(200, 10, 10) == pytest.approx(1 - 0.95**10)


@pytest.mark.parametrize("q", [0.0, 1e-9, 0.013, 0.5, 1.0])
def test_expected_rounds_is_the_sum_over_first_use(q):
    r = 30
    direct = sum(1 - (1 - q) ** j for j in range(1, r + 1))
    assert expected_recomputed_rounds(q, r) == pytest.approx(direct, rel=1e-9, abs=1e-12)
    # E[rounds] = sum over the first use f of P(f) (r - f + 1)
    by_first = sum(q * (1 - q) ** (f - 1) * (r - f + 1) for f in range(1, r + 1))
    assert expected_recomputed_rounds(q, r) == pytest.approx(by_first, rel=1e-9, abs=1e-12)
    assert recompute_probability(q, r) == pytest.approx(1 - (1 - q) ** r)


def test_one_client_costs_its_expected_rounds_over_retrain_s():
    cost = client_request(MNIST, 1, 30)
    assert cost.cost_ratio == pytest.approx(cost.expected_rounds / 30)
    work = expected_distinct_clients(299, 5)
    assert cost.retrain_trajectories == pytest.approx(30 * work)
    assert cost.expected_bytes is None  # model size not given


def test_bytes_are_two_model_transfers_per_trajectory():
    inputs = PlanInputs(**{**MNIST.__dict__, "num_params": 1000})
    cost = client_request(inputs, 1, 30)
    assert cost.expected_bytes == pytest.approx(cost.expected_trajectories * 2 * 4000)


def test_a_sequence_of_requests_removes_a_client_each_time_with_k_frozen():
    inputs = PlanInputs((50,) * 20, 10, "tv_stable", 0.1, 5, local_steps=2)
    seq = sequential_requests(inputs, 4)
    expected = [recompute_probability(client_round_probability(20 - j, 2), 10) for j in range(4)]
    assert seq.recompute_probabilities == pytest.approx(expected)
    assert seq.expected_recomputations == pytest.approx(sum(expected))
    assert seq.expected_rounds == pytest.approx(
        sum(expected_recomputed_rounds(client_round_probability(20 - j, 2), 10) for j in range(4))
    )
    assert seq.recompute_probabilities[3] > seq.recompute_probabilities[0]  # M shrinks
    assert seq.bound_recomputations == pytest.approx(4 * 4 * min(1.0, 2 * 10 / 20))


def test_break_even_is_the_first_n_whose_one_at_a_time_cost_reaches_one_retrain():
    inputs = PlanInputs((50,) * 20, 10, "tv_stable", 0.1, 5, local_steps=2)
    seq = sequential_requests(inputs, 1)
    spent, n_star = 0.0, None
    for j in range(19):
        q = client_round_probability(20 - j, 2)
        spent += expected_recomputed_rounds(q, 10) * expected_distinct_clients(19 - j, 2)
        if spent >= 10 * expected_distinct_clients(19 - j, 2):
            n_star = j + 1
            break
    assert seq.break_even == n_star
    assert n_star is not None
    assert n_star > 1


def test_one_request_of_many_clients_saves_little():
    plan = plan_deletions(MNIST, after_round=30)
    w = plan.batch_break_even
    assert client_request(MNIST, w, 30).cost_ratio >= 0.9
    assert client_request(MNIST, w - 1, 30).cost_ratio < 0.9


def test_fraction_sampling_first_participation_is_geometric():
    inputs = PlanInputs((40,) * 100, 20, "fraction", 0.1, 8)
    cost = client_request(inputs, 1)
    assert cost.round_probability == pytest.approx(0.1)  # 10 of 100 per round
    assert cost.expected_rounds == pytest.approx(expected_recomputed_rounds(0.1, 20))
    assert cost.cost_ratio == pytest.approx(cost.expected_rounds / 20)
    # epochs read every sample: a sample request costs what its client's does
    assert sample_request(inputs).expected_rounds == pytest.approx(cost.expected_rounds)
    full = client_request(PlanInputs((40,) * 10, 5, "fraction", 1.0, 8), 1)
    assert full.recompute_probability == 1.0
    assert full.cost_ratio == pytest.approx(1.0)
    plan = plan_deletions(inputs)
    assert plan.tv_stable_draws == 10
    assert plan.tv_stable_client.expected_rounds < cost.expected_rounds


def test_equal_shards_recompute_one_shard():
    sharded = PlanInputs(
        (50,) * 40, 10, "tv_stable", 0.1, 5, local_steps=2, shard_of=tuple(c % 4 for c in range(40))
    )
    shard = PlanInputs((50,) * 10, 10, "tv_stable", 0.1, 5, local_steps=2)
    cost, inside = client_request(sharded, 1), client_request(shard, 1)
    assert cost.expected_rounds == pytest.approx(inside.expected_rounds)
    work = expected_distinct_clients(10, 1)
    # Retrain retrains all four shards, one of them a client short
    assert cost.retrain_trajectories == pytest.approx(
        10 * (3 * work + expected_distinct_clients(9, 1))
    )
    assert cost.cost_ratio == pytest.approx(
        inside.expected_trajectories / cost.retrain_trajectories
    )
    assert cost.cost_ratio < inside.cost_ratio / 3


def test_clients_of_one_request_fall_into_shards_hypergeometrically():
    # M = 4 in 2 shards {0, 2}, {1, 3} (c mod 2); 2 clients at once: enumerate the 6 pairs
    inputs = PlanInputs((20,) * 4, 6, "tv_stable", 0.5, 4, local_steps=1, shard_of=(0, 1, 0, 1))
    shard = PlanInputs((20,) * 2, 6, "tv_stable", 0.5, 4, local_steps=1)
    one = client_request(shard, 1)
    k = 1  # round(0.5 * 2)
    both = 6.0  # one shard loses both its clients: q = 1, every round recomputed
    pairs = list(itertools.combinations(range(4), 2))
    expected = 0.0
    for pair in pairs:
        shards = [c % 2 for c in pair]
        if shards[0] == shards[1]:
            expected += both * expected_distinct_clients(0, k)
        else:
            expected += 2 * one.expected_rounds * expected_distinct_clients(1, k)
    cost = client_request(inputs, 2)
    assert cost.expected_trajectories == pytest.approx(expected / len(pairs))
    assert cost.recompute_probability is None  # several shards: no single q


def test_shards_from_the_config_map_or_the_run_s_balanced_split():
    training = {"sampling": "tv_stable", "local_steps": 3, "participation": 0.5, "rounds": 7}
    data = {"dataset": "digits", "num_clients": 6}
    mapped = parse_config(
        {
            "data": data,
            "training": {
                **training,
                "shards": 2,
                "shard_map": {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1},
            },
        }
    )
    inputs = PlanInputs.from_config(mapped, [30] * 6)
    assert [s.clients for s in inputs.shards()] == [(0, 1, 2, 3), (4, 5)]
    assert [s.draws for s in inputs.shards()] == [2, 1]  # round(0.5 x M_s)
    assert inputs.local_steps == 3
    assert inputs.rounds == 7
    assert inputs.rho_client(7) == pytest.approx(max(2 * 7 / 4, 1 * 7 / 2))
    balanced = parse_config({"seed": 5, "data": data, "training": {**training, "shards": 4}})
    plan = shard_plan(balanced)
    inputs = PlanInputs.from_config(balanced, [30] * 6)
    assert inputs.shard_of == tuple(plan.shard_of[c] for c in range(6))  # the run's own split
    assert sorted(s.size for s in inputs.shards()) == [1, 1, 2, 2]


def test_worst_client_is_the_smallest():
    inputs = PlanInputs((80, 20, 50), 10, "tv_stable", 0.5, 4, local_steps=2)
    plan = plan_deletions(inputs)
    assert plan.worst_client == 1
    assert plan.rho_sample_worst == pytest.approx(10 * 2 * 2 * 4 / (3 * 20))
    assert plan.sample_worst.recompute_probability > plan.sample.recompute_probability
    # a random sample's owner is weighted by N_k
    q = [client_round_probability(3, 2) * sample_use_probability(n, 4, 2) for n in (80, 20, 50)]
    weights = [n / 150 for n in (80, 20, 50)]
    assert plan.sample.round_probability == pytest.approx(
        sum(w * x for w, x in zip(weights, q, strict=True))
    )


def test_bad_requests_are_refused():
    with pytest.raises(ValueError, match=r"forgets 1\.\.299 clients \(one remains\); got 300$"):
        client_request(MNIST, 300)
    with pytest.raises(ValueError, match=r"must be in 1\.\.299 \(one client remains\); got 0$"):
        sequential_requests(MNIST, 0)
    with pytest.raises(ValueError, match="after round 1 or later"):
        client_request(MNIST, 1, 0)
    with pytest.raises(ValueError, match="needs local_steps"):
        PlanInputs((5, 5), 3, "tv_stable", 0.5, 2)


def test_readiness_counts_what_a_request_would_recompute():
    got = readiness_from_first_rounds({0: None, 1: 3, 2: 1, 3: None}, draws=9, rounds=5)
    assert got["never_drawn"] == [0, 3]
    assert got["rounds_to_recompute"] == {"0": 0, "1": 3, "2": 5, "3": 0}
    assert got["mean_rounds_to_recompute"] == pytest.approx(2.0)
    assert got["recompute_rate"] == pytest.approx(0.5)
    assert got["draws_per_client"] == pytest.approx(9 / 4)
    assert math.isclose(got["rounds"], 5)


class _Index:
    """A participation index: round -> (client, multiplicity); round 0 is the initial model."""

    def __init__(self, rounds):
        self._rounds = rounds

    def rounds(self):
        return [0, *self._rounds]

    def client_records(self, round_):
        return [
            ClientRecord(c, "accepted", 40, scalars={"multiplicity": m})
            for c, m in self._rounds.get(round_, [])
        ]


def test_deletion_readiness_reads_first_draws_and_skips_forgotten_clients():
    config = parse_config(
        {
            "data": {"dataset": "digits", "num_clients": 4},
            "training": {"sampling": "tv_stable", "local_steps": 2, "rounds": 3},
        }
    )  # participation 1.0: K = 4 draws per round
    index = _Index({1: [(0, 3), (2, 1)], 2: [(1, 2), (2, 2)], 3: [(0, 4)]})
    got = deletion_readiness(index, config, forgotten=frozenset({2}))
    assert got["first_drawn_round"] == {"0": 1, "1": 2, "3": None}
    assert got["never_drawn"] == [3]
    assert got["rounds_to_recompute"] == {"0": 3, "1": 2, "3": 0}
    assert got["draws_per_client"] == pytest.approx((3 + 2 + 4) / 3)  # client 2's draws left out
    predicted = expected_recomputed_rounds(client_round_probability(4, 4), 3)
    assert got["predicted"]["expected_rounds"] == pytest.approx(predicted)
    assert deletion_readiness(_Index({}), config) is None  # no completed round
