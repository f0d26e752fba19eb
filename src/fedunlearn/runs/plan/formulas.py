"""The planner's formulas: per-round use probabilities and the geometric first use.

Pure functions of M, K, N_k, b, E and r_u (docstring of ``fedunlearn.runs.plan``; design note
docs/deletion_ready.md, "Planner").
"""

from __future__ import annotations

import math

__all__ = [
    "client_round_probability",
    "expected_distinct_clients",
    "expected_recomputed_rounds",
    "fraction_round_probability",
    "hypergeometric",
    "recompute_probability",
    "sample_use_probability",
]

# ----- formulas ----------------------------------------------------------------------------------


def client_round_probability(num_clients: float, draws: int, clients: int = 1) -> float:
    """q_C(w): the probability that a round's ``draws`` draws with replacement hit one of w."""
    if not 0 <= clients <= num_clients:
        raise ValueError(f"clients must be in 0..{num_clients}; got {clients}")
    return -math.expm1(draws * math.log1p(-clients / num_clients)) if clients < num_clients else 1.0


def fraction_round_probability(num_clients: int, count: int, clients: int = 1) -> float:
    """q_F(w): the probability that ``count`` clients drawn without replacement include one of w."""
    if count >= num_clients or clients + count > num_clients:
        return 1.0 if clients else 0.0
    return 1.0 - math.comb(num_clients - clients, count) / math.comb(num_clients, count)


def sample_use_probability(
    num_samples: int, batch_size: int, steps: int, samples: int = 1
) -> float:
    """u(s): the probability that E mini-batches of b (each without replacement) use one of s."""
    if samples >= num_samples or batch_size > num_samples - samples:
        return 1.0 if samples else 0.0
    miss = math.comb(num_samples - samples, batch_size) / math.comb(num_samples, batch_size)
    return -math.expm1(steps * math.log(miss))


def recompute_probability(q: float, rounds: int) -> float:
    """P(recompute) = 1 - (1-q)^r: some round of ``rounds`` used the data."""
    if q >= 1:
        return 1.0 if rounds > 0 else 0.0
    return -math.expm1(rounds * math.log1p(-q))


def expected_recomputed_rounds(q: float, rounds: int) -> float:
    """E[recomputed rounds] = r - (1-q)(1 - (1-q)^r)/q: rounds from the first use to ``rounds``."""
    if q <= 0:
        return 0.0
    if q >= 1:
        return float(rounds)
    return rounds - (1 - q) * recompute_probability(q, rounds) / q


def expected_distinct_clients(num_clients: float, draws: int) -> float:
    """M(1 - (1 - 1/M)^K): distinct clients among K draws with replacement (trajectories)."""
    if num_clients <= 0:
        return 0.0
    return num_clients * client_round_probability(num_clients, draws, 1)


def hypergeometric(total: int, group: int, drawn: int, hits: int) -> float:
    """P(``hits`` of ``drawn`` picked without replacement from ``total`` fall in ``group``)."""
    if hits > group or drawn - hits > total - group or hits < 0:
        return 0.0
    return math.comb(group, hits) * math.comb(total - group, drawn - hits) / math.comb(total, drawn)
