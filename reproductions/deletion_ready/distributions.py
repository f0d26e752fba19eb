r"""Distribution tests of deletion-ready unlearning, with power (design note §6.2 a, b, e).

Runs ``fedunlearn.eval.exactness`` at the design note's sizes and prints three Markdown tables:

1. sampler goodness of fit: 30,000 mini-batches (2 of 6 samples) and 30,000 rounds (3 slots
   over 4 clients) against their laws;
2. the toy two-sample test (M=3, K=2, R=3, E=2, N=3, b=1; delete sample 0 of client 0),
   n histories per group, for fedunlearn's replay and the paper's rules: p-values of Z (rounds
   that draw client 0) and U (client 0's steps on sample 1), the exact w^2 of each rule against
   retraining, and the test's power (Bonferroni alpha/2 per statistic);
3. the cost calibration: simulated histories (no training) in the FATS MNIST setting against
   the planner (exact binomial test of the recompute rate, z of the mean recomputed rounds).

    nice -n 10 python reproductions/deletion_ready/distributions.py --histories 20000 \
        --calibration 10000
"""

from __future__ import annotations

import argparse
import platform
import time
from datetime import UTC, datetime

import numpy as np

from fedunlearn.eval.exactness import (
    RULES,
    Toy,
    calibrate_costs,
    detectable_effect,
    homogeneity_test,
    power,
    simulate,
    slot_test,
    statistics,
    subset_test,
    toy_laws,
    unlearn,
)

ALPHA = 0.01


def _seeds(n: int, key: int) -> np.ndarray:
    return np.random.default_rng(key).integers(0, 2**63, n, dtype=np.uint64)


def _w2(p: list[float], q: list[float]) -> float:
    a, b = np.asarray(p), np.asarray(q)
    cells = (a + b) > 0
    return float(((a - b)[cells] ** 2 / (a + b)[cells]).sum())


def goodness_of_fit(draws: int) -> str:
    """Table 1: the samplers against their laws."""
    subsets = subset_test(_seeds(draws, 1), 6, 2)
    ordered, multisets = slot_test(_seeds(draws, 2), 4, 3)
    rows = [
        ("mini-batch: 2 of 6 samples (uniform)", subsets),
        ("round: 3 slots over 4 clients, ordered (uniform)", ordered),
        ("round: 3 slots over 4 clients, multiset (multinomial)", multisets),
    ]
    lines = ["| draws | cells | chi2 | p |", "|---|---|---|---|"]
    lines += [f"| {name} | {r.df + 1} | {r.statistic:.1f} | {r.p_value:.3f} |" for name, r in rows]
    return "\n".join(lines)


def two_sample(n: int) -> str:
    """Table 2: each rule's unlearned histories against retraining on D'."""
    toy = Toy()
    trained = simulate(_seeds(n, 10), toy, reduced=False)
    same_seed = simulate(_seeds(n, 10), toy, reduced=True)
    fresh = simulate(_seeds(n, 11), toy, reduced=True)
    z_ref, u_ref = statistics(simulate(_seeds(n, 12), toy, reduced=True))
    laws = toy_laws(toy)
    lines = [
        "| rule | P(Z=0..3) exact | w2 (Z) | w2 (U) | p (Z) | p (U) | verdict | power |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rule in RULES:
        z, u = statistics(unlearn(rule, trained, same_seed, fresh))
        p_z, p_u = homogeneity_test(z, z_ref).p_value, homogeneity_test(u, u_ref).p_value
        law_z, law_u = laws[rule]
        w2 = [_w2(laws["retrain"][0], law_z), _w2(laws["retrain"][1], law_u)]
        reach = max(power(laws["retrain"][k], laws[rule][k], n, ALPHA / 2) for k in (0, 1))
        verdict = "pass" if min(p_z, p_u) >= ALPHA / 2 else "FAIL"
        lines.append(
            f"| {rule} | {' / '.join(f'{p:.3f}' for p in law_z)} | {w2[0]:.4f} | {w2[1]:.4f} | "
            f"{p_z:.3g} | {p_u:.3g} | {verdict} | "
            + ("-" if max(w2) < 1e-12 else f"{reach:.4f}")
            + " |"
        )
    lines.append(
        f"\n90 % power at n = {n} per group, alpha/2 = {ALPHA / 2}: w2 >= "
        f"{detectable_effect(n, 3, ALPHA / 2):.5f} (Z, df 3), "
        f"{detectable_effect(n, 6, ALPHA / 2):.5f} (U, df 6)"
    )
    return "\n".join(lines)


def calibration(n: int) -> str:
    """Table 3: simulated recomputation against the planner (FATS MNIST setting)."""
    toy = Toy(num_clients=300, draws=5, rounds=30, local_steps=10, num_samples=200, batch_size=10)
    lines = [
        "| request | histories | recomputed | planner P | binomial p | mean rounds | planner "
        "E[rounds] | z |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, kind in enumerate(("client", "sample")):
        c = calibrate_costs(_seeds(n, 20 + key), toy, kind)
        lines.append(
            f"| 1 {kind} | {c.histories} | {c.recomputed} ({c.recomputed / c.histories:.3f}) | "
            f"{c.predicted_probability:.3f} | {c.binomial_p_value:.3f} | {c.mean_rounds:.2f} | "
            f"{c.predicted_rounds:.2f} | {c.z:+.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--draws", type=int, default=30_000, help="sampler draws per test")
    parser.add_argument("--histories", type=int, default=20_000, help="toy histories per group")
    parser.add_argument("--calibration", type=int, default=10_000, help="calibration histories")
    args = parser.parse_args()
    start = time.time()
    print(goodness_of_fit(args.draws), end="\n\n")
    print(two_sample(args.histories), end="\n\n")
    print(calibration(args.calibration))
    print(
        f"\n{time.time() - start:.0f} s wall; {platform.machine()}, numpy {np.__version__}, "
        f"{datetime.now(UTC):%Y-%m-%d}"
    )


if __name__ == "__main__":
    main()
