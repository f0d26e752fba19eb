"""Exactness in law of deletion-ready unlearning (``fedunlearn.eval.exactness``, issue 32).

The fast path (``fedunlearn.eval.draws``) must draw exactly what the library's samplers draw;
the tests then run on it: sampler goodness of fit, the history-level two-sample test with the
paper's rules as negative controls (their power computed from the exact laws), and the cost
calibration of the planner.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from fedunlearn.eval.draws import batch_members, client_seeds, client_slots, derive_seeds
from fedunlearn.eval.exactness import (
    RULES,
    Toy,
    calibrate_costs,
    detectable_effect,
    first_use,
    homogeneity_test,
    pearson_test,
    power,
    simulate,
    slot_test,
    statistics,
    subset_test,
    toy_laws,
    unlearn,
)
from fedunlearn.fl.sampling import TvStableSampler, step_batches
from fedunlearn.fl.seeding import derive_seed

ALPHA = 0.01
N_HISTORIES = 20_000  # per group (design note: 90 % power for any bias with w^2 >= 0.001)


def _seeds(n: int, key: int) -> np.ndarray:
    return np.random.default_rng(key).integers(0, 2**63, n, dtype=np.uint64)


# ----- the fast path draws what the library draws ------------------------------------------------


@pytest.mark.parametrize(
    ("purpose", "keys"),
    [("tv_clients", (3, 1)), ("client", (2, 5, 0)), ("tv_batch", (7,)), ("sampling", (4,))],
)
def test_derive_seeds_is_derive_seed(purpose, keys):
    seeds = np.concatenate(
        [
            np.array([0, 1, 7, 2**32 - 1, 2**32, 2**63 - 1, 2**64 - 1], dtype=np.uint64),
            _seeds(200, 1),
        ]
    )
    got = derive_seeds(seeds, purpose, *keys)
    assert [int(g) for g in got] == [derive_seed(int(s), purpose, *keys) for s in seeds]


def test_derive_seeds_broadcasts_keys_of_any_width():
    seeds = _seeds(6, 2)
    rounds = np.array([1, 2**32, 2**40 + 3], dtype=np.uint64)
    got = derive_seeds(seeds[:, None], "client", rounds[None, :], 4, 0)
    assert got.shape == (6, 3)
    for i, s in enumerate(seeds):
        for j, r in enumerate(rounds):
            assert int(got[i, j]) == derive_seed(int(s), "client", int(r), 4, 0)


def test_client_slots_are_the_tv_stable_sampler_s():
    seeds = _seeds(25, 3)
    present = [0, 2, 3, 5, 9]
    slots = client_slots(seeds, 4, 3, present)
    for i, seed in enumerate(seeds):
        sampler = TvStableSampler(3, int(seed))
        for r in range(1, 5):
            assert Counter(slots[i, r - 1].tolist()) == dict(sampler.draw(r, present).multiplicity)


def test_batch_members_are_step_batches_on_the_full_and_the_reduced_data():
    seeds = _seeds(25, 4)
    local = client_seeds(seeds, 2, [0, 3])
    assert int(local[5, 1, 1]) == derive_seed(int(seeds[5]), "client", 2, 3, 0)
    full = batch_members(local, range(8), 3, 2)
    reduced = batch_members(local, range(8), 3, 2, deleted=[0, 5])
    kept = np.array([1, 2, 3, 4, 6, 7])
    for i in range(25):
        for r in range(2):
            for c in range(2):
                seed = int(local[i, r, c])
                for step, batch in enumerate(step_batches(seed, np.arange(8), 3, 2)):
                    assert np.nonzero(full[i, r, c, step])[0].tolist() == batch.tolist()
                for step, batch in enumerate(step_batches(seed, kept, 3, 2)):
                    assert np.nonzero(reduced[i, r, c, step])[0].tolist() == kept[batch].tolist()


# ----- sampler goodness of fit -------------------------------------------------------------------


def test_mini_batches_are_uniform_b_subsets():
    result = subset_test(_seeds(30_000, 5), 6, 2)  # 15 subsets, 2,000 expected each
    assert result.df == 14
    assert result.p_value >= ALPHA


def test_slots_are_iid_uniform_and_multisets_multinomial():
    ordered, multisets = slot_test(_seeds(30_000, 6), 4, 3)
    assert (ordered.df, multisets.df) == (63, 19)
    assert ordered.p_value >= ALPHA
    assert multisets.p_value >= ALPHA
    # the test can fail: 30,000 rounds of one repeated seed per 100 are far from the law
    repeated = np.repeat(_seeds(300, 7), 100)
    assert subset_test(repeated, 6, 2).p_value < ALPHA


def test_pearson_and_homogeneity_tests():
    assert pearson_test([50, 50], [0.5, 0.5]).statistic == 0.0
    assert pearson_test([90, 10], [0.5, 0.5]).p_value < 1e-10
    a = np.array([0] * 30 + [1] * 30 + [5])  # the lone 5 is pooled with 1
    result = homogeneity_test(a, a.copy())
    assert (result.statistic, result.df, result.p_value) == (0.0, 1, 1.0)


# ----- the toy: exact laws -----------------------------------------------------------------------


def test_exact_laws_of_the_toy():
    laws = toy_laws()
    z_retrain, u_retrain = laws["retrain"]
    q = 5 / 9  # 1 - (2/3)^2
    binomial = [1 * (1 - q) ** 3, 3 * q * (1 - q) ** 2, 3 * q**2 * (1 - q), q**3]
    assert z_retrain == pytest.approx(binomial)
    # fedunlearn's replay has the retrain law exactly, on both statistics
    assert laws["replay"][0] == pytest.approx(z_retrain, abs=1e-12)
    assert laws["replay"][1] == pytest.approx(u_retrain, abs=1e-12)
    # the paper's rules (design note table, Monte Carlo there; exact here)
    assert [round(p, 3) for p in laws["alg2"][0]] == [0.137, 0.369, 0.365, 0.130]
    assert [round(p, 3) for p in laws["proof_b2"][0]] == [0.197, 0.425, 0.305, 0.073]
    # never recomputing keeps the client draws' law; only the batches show it
    assert laws["never"][0] == pytest.approx(z_retrain)
    assert laws["never"][1][0] == pytest.approx(0.3305, abs=1e-4)


def test_power_of_the_test_against_the_paper_s_rule_as_the_design_note_states():
    laws = toy_laws()
    retrain, alg2 = laws["retrain"][0], laws["alg2"][0]
    # "n ~ 870 per group for 90 % power" (alpha 0.01, df 3, w^2 ~ 0.022)
    assert 0.85 < power(retrain, alg2, 870, ALPHA) < 0.95
    assert power(retrain, retrain, 870, ALPHA) == ALPHA
    # and the smallest effect n = 870 detects with 90 % power is the paper's rule's
    assert detectable_effect(870, 3, ALPHA) == pytest.approx(0.022, abs=0.001)
    # n = 20,000 per group: any bias with w^2 >= 0.00096 (design note) at alpha 0.01
    assert detectable_effect(N_HISTORIES, 3, ALPHA) == pytest.approx(0.00096, abs=0.00003)


# ----- the toy: simulated histories --------------------------------------------------------------


@pytest.fixture(scope="module")
def toy_groups():
    toy = Toy()
    seeds_a, seeds_fresh, seeds_b = (_seeds(N_HISTORIES, k) for k in (10, 11, 12))
    trained = simulate(seeds_a, toy, reduced=False)
    same_seed = simulate(seeds_a, toy, reduced=True)
    fresh = simulate(seeds_fresh, toy, reduced=True)
    reference = simulate(seeds_b, toy, reduced=True)
    return trained, same_seed, fresh, reference


def test_replay_is_training_from_scratch_on_the_reduced_data_draw_for_draw(toy_groups):
    trained, same_seed, fresh, _ = toy_groups
    replayed = unlearn("replay", trained, same_seed, fresh)
    assert replayed.same(same_seed).all()
    # the kept prefix is the trained run's own: the rounds before the first use are unchanged
    r_first, _ = first_use(trained)
    used = r_first < trained.slots.shape[1]
    # used in some histories, not all: 1 - (1 - (5/9)(1 - (2/3)^2))^3 = 0.670
    assert used.mean() == pytest.approx(1 - (1 - 25 / 81) ** 3, abs=0.02)
    before = np.arange(trained.slots.shape[1])[None, :] < r_first[:, None]  # (n, R)
    assert (trained.slots == replayed.slots).all(axis=-1)[before].all()
    assert (trained.used == replayed.used).all(axis=(-2, -1))[before].all()
    assert not replayed.used[..., 0].any()  # the deleted sample is in no batch


def test_simulated_rules_follow_their_exact_laws(toy_groups):
    trained, same_seed, fresh, _ = toy_groups
    laws = toy_laws()
    for rule in RULES:
        z, u = statistics(unlearn(rule, trained, same_seed, fresh))
        law_z, law_u = laws[rule]
        assert pearson_test(np.bincount(z, minlength=4), law_z).p_value > 1e-3, rule
        counts_u = np.bincount(u, minlength=7)
        # pool U >= 4 (small cells)
        pooled = [*counts_u[:4], counts_u[4:].sum()]
        assert pearson_test(pooled, [*law_u[:4], sum(law_u[4:])]).p_value > 1e-3, rule


def test_two_sample_test_passes_the_replay_and_fails_the_paper_s_rules(toy_groups):
    trained, same_seed, fresh, reference = toy_groups
    z_ref, u_ref = statistics(reference)
    laws = toy_laws()
    p_values = {}
    for rule in RULES:
        z, u = statistics(unlearn(rule, trained, same_seed, fresh))
        p_values[rule] = min(homogeneity_test(z, z_ref).p_value, homogeneity_test(u, u_ref).p_value)
    assert p_values["replay"] >= ALPHA / 2  # Bonferroni over the two statistics
    for wrong in ("alg2", "redraw_round", "proof_b2", "never"):
        assert p_values[wrong] < ALPHA / 2, wrong
        detect = max(
            power(laws["retrain"][k], laws[wrong][k], N_HISTORIES, ALPHA / 2) for k in (0, 1)
        )
        assert detect > 0.999, wrong


# ----- cost calibration --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["client", "sample"])
def test_planner_predicts_the_simulated_cost(kind):
    # the design note's MNIST setting: M=300, K=5, E=10, b=10, N=200, requests after round 30
    toy = Toy(num_clients=300, draws=5, rounds=30, local_steps=10, num_samples=200, batch_size=10)
    result = calibrate_costs(_seeds(2_000, 20 if kind == "client" else 21), toy, kind)
    assert result.histories == 2_000
    assert result.binomial_p_value >= ALPHA
    assert abs(result.z) < 3
    assert result.predicted_probability == pytest.approx(
        0.394 if kind == "client" else 0.181, abs=1e-3
    )
