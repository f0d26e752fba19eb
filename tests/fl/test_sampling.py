"""Client samplers and deletion-consistent mini-batches (``fedunlearn.fl.sampling``)."""

from __future__ import annotations

import numpy as np
import pytest

from fedunlearn.errors import ConfigError
from fedunlearn.fl.engine import sample_clients
from fedunlearn.fl.sampling import (
    ClientDraw,
    FractionSampler,
    TvStableSampler,
    batches_use,
    item_keys,
    step_batches,
    tv_clients_per_round,
)


def test_keys_are_distinct_deterministic_and_depend_on_the_stream():
    ids = np.arange(5000)
    keys = item_keys(123, ids)
    assert len(np.unique(keys)) == 5000
    assert np.array_equal(keys, item_keys(123, ids))
    assert not np.array_equal(keys, item_keys(124, ids))
    # a key depends on the id, not on its position among the others
    assert np.array_equal(item_keys(123, ids[::-1])[::-1], keys)


def test_fraction_sampler_is_the_engine_s_sampling():
    ids = list(range(30))
    for round_ in range(1, 6):
        assert list(FractionSampler(0.2, 7).draw(round_, ids).ids) == sample_clients(
            ids, 0.2, 7, round_
        )
    draw = FractionSampler(1.0, 7).draw(1, [5, 2, 9])
    assert draw.ids == (2, 5, 9)
    assert draw.weights() is None  # FedAvg by n_c


def test_tv_stable_draws_k_slots_with_replacement_weighted_by_multiplicity():
    sampler = TvStableSampler(6, seed=3)
    draws = [sampler.draw(r, range(4)) for r in range(1, 40)]
    assert all(sum(d.multiplicity.values()) == 6 for d in draws)
    assert any(max(d.multiplicity.values()) > 1 for d in draws)  # with replacement
    assert draws[0] == sampler.draw(1, [3, 2, 1, 0])  # order of the present ids is irrelevant
    weights = draws[0].weights()
    assert weights == {c: float(m) for c, m in draws[0].multiplicity.items()}


def test_removing_a_client_moves_only_the_slots_it_won():
    sampler = TvStableSampler(5, seed=11)
    everyone, without = list(range(20)), [c for c in range(20) if c != 7]
    moved = 0
    for round_ in range(1, 200):
        full = sampler.draw(round_, everyone).multiplicity
        reduced = sampler.draw(round_, without).multiplicity
        if 7 not in full:
            assert full == reduced
        else:
            moved += 1
            kept = {c: m for c, m in full.items() if c != 7}
            assert all(reduced.get(c, 0) >= m for c, m in kept.items())
            assert sum(reduced.values()) == 5
    assert moved > 20  # client 7 was drawn in some rounds


def test_tv_stable_slots_are_uniform():
    # 3 slots over 4 clients: each slot's winner is uniform (chi-square over 4 cells)
    from scipy.special import chdtrc

    sampler = TvStableSampler(3, seed=0)
    counts = np.zeros(4)
    for round_ in range(1, 1001):
        for client, m in sampler.draw(round_, range(4)).multiplicity.items():
            counts[client] += m
    assert counts.sum() == 3000
    statistic = float(((counts - 750.0) ** 2 / 750.0).sum())
    assert chdtrc(3, statistic) > 0.001


def test_k_is_participation_of_the_run_s_clients():
    assert tv_clients_per_round(0.005, 1000) == 5
    assert tv_clients_per_round(0.001, 100) == 1


def test_a_client_draw_rejects_zero_multiplicity():
    with pytest.raises(ConfigError, match="multiplicities must be >= 1"):
        ClientDraw({3: 0})


def test_step_batches_take_b_distinct_samples_in_id_order():
    ids = np.arange(40)
    batches = step_batches(99, ids, 8, 5)
    assert len(batches) == 5
    for batch in batches:
        assert len(set(batch.tolist())) == 8
        assert list(batch) == sorted(batch)
    assert all(
        np.array_equal(a, b) for a, b in zip(batches, step_batches(99, ids, 8, 5), strict=True)
    )


def test_deleting_a_sample_changes_only_the_batches_that_drew_it():
    ids = np.arange(50)
    full = step_batches(5, ids, 6, 30)
    reduced_ids = np.delete(ids, 17)  # sample 17 deleted; the others keep their ids
    reduced = step_batches(5, reduced_ids, 6, 30)
    changed = 0
    for before, after in zip(full, reduced, strict=True):
        drawn_before, drawn_after = set(ids[before]), set(reduced_ids[after])
        if 17 in drawn_before:
            changed += 1
            assert len(drawn_before - drawn_after) == 1  # only 17 left the batch
        else:
            assert drawn_before == drawn_after
    assert changed > 0


def test_a_client_smaller_than_a_batch_is_refused():
    with pytest.raises(ConfigError, match="fewer than the mini-batch of 8"):
        step_batches(1, np.arange(5), 8, 1)


def test_batches_use_in_step_and_epoch_mode():
    ids = np.arange(30)
    drawn = set(np.concatenate(step_batches(4, ids, 3, 2)).tolist())
    unused = next(i for i in range(30) if i not in drawn)
    assert batches_use(4, ids, {min(drawn)}, 3, 2)
    assert not batches_use(4, ids, {unused}, 3, 2)
    assert batches_use(4, ids, {unused}, 3, None)  # an epoch passes over every sample
    assert not batches_use(4, ids, {99}, 3, None)
