"""What a deletion will cost, before training: the planner of deletion-ready runs.

Paper: Tao et al., "Communication Efficient and Provable Federated Unlearning" (FATS), PVLDB 17(5)
2024, Lemma 1 (ρ), Theorem 1 and §5.3.1 (bounds). Design note: docs/deletion_ready.md, "Planner".

A run recomputes, for a request processed after round r_u, the rounds from the first one that
drew a forgotten client (or used a deleted sample) to r_u (``unlearn.deletion_ready.tv_exact``;
Retrain recomputes all r_u). Draws are independent across rounds, so the first use is geometric:

    q_C(w) = 1 - (1 - w/M)^K                     # TV-stable: K draws with replacement, w clients
    q_F(w) = 1 - C(M-w, n) / C(M, n)             # fraction sampling, n = max(1, ceil(p M))
    u_k(s) = 1 - (C(N_k - s, b) / C(N_k, b))^E   # one of s samples in one of E batches of b
    q_S = q_C(1) u_k(s)                          # fraction sampling: u = 1 (epochs read all)
    P(recompute) = 1 - (1 - q)^r_u
    E[recomputed rounds] = sum_{j<=r_u} (1 - (1-q)^j) = r_u - (1-q)(1 - (1-q)^r_u) / q

A client drawn m times in a round runs one trajectory (weight m/K), so u_k does not depend on m.
A recomputed round costs one trajectory per distinct client drawn, M(1 - (1-1/M)^K) expected
(n under fraction sampling), and 2 model transfers each; Retrain costs r_u such rounds, so the
expected cost ratio of one request is E[recomputed rounds] / r_u. Nominal ρ (Lemma 1):
ρ_C = K r_u / M and ρ_S,k = r_u K E b / (M N_k) (the planner reports the worst client); the
paper's bounds P(recompute) <= min(1, ρ) and E[#recomputations over n requests] <= 4 n min(1, ρ)
are shown beside the exact values.

Shards (``training.shards`` S > 1): each shard is its own federation of M_s clients
(K_s = max(1, round(p M_s))), and a request recomputes only in the shards that hold its data;
w clients at once fall into shards hypergeometrically (with replacement that is the
S(1 - (1 - 1/S)^w) shards of the SISA literature). Retrain retrains every shard.

Sequences: n single-client requests served one at a time, each on the run left by the previous
one (M decreases by one each time, K stays frozen); their expected cost is the sum of each
request's. Break-even: the number n* of such requests after which serving each at once has cost
as much as one Retrain removing all n* together would (if the requests can wait and be batched);
and the number of clients w in one request from which it saves less than 10 % of Retrain.
"""

from fedunlearn.runs.plan.costs import (
    RequestCost,
    SequenceCost,
    batch_break_even,
    client_request,
    sample_request,
    sequential_requests,
)
from fedunlearn.runs.plan.formulas import (
    client_round_probability,
    expected_distinct_clients,
    expected_recomputed_rounds,
    fraction_round_probability,
    recompute_probability,
    sample_use_probability,
)
from fedunlearn.runs.plan.inputs import PlanInputs
from fedunlearn.runs.plan.overview import (
    Plan,
    deletion_readiness,
    plan_deletions,
    readiness_from_first_rounds,
)

__all__ = [
    "Plan",
    "PlanInputs",
    "RequestCost",
    "SequenceCost",
    "batch_break_even",
    "client_request",
    "client_round_probability",
    "deletion_readiness",
    "expected_distinct_clients",
    "expected_recomputed_rounds",
    "fraction_round_probability",
    "plan_deletions",
    "readiness_from_first_rounds",
    "recompute_probability",
    "sample_request",
    "sample_use_probability",
    "sequential_requests",
]
