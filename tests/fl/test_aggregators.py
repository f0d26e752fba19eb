import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedunlearn.errors import ConfigError, UnknownNameError
from fedunlearn.fl.aggregators import (
    coordinate_median,
    fedavg,
    krum_scores,
    make_aggregator,
    multi_krum,
    trimmed_mean,
)

DELTAS = torch.tensor([[1.0, 10.0], [2.0, 20.0], [3.0, -30.0], [100.0, 0.0]])


def test_fedavg_weights_by_sample_count():
    out = fedavg(DELTAS[:2], torch.tensor([1.0, 3.0]))
    assert torch.allclose(out, torch.tensor([1.75, 17.5]))


def test_median_even_count_averages_middle_values():
    assert torch.equal(coordinate_median(DELTAS), torch.tensor([2.5, 5.0]))
    assert torch.equal(coordinate_median(DELTAS[:3]), torch.tensor([2.0, 10.0]))


def test_trimmed_mean_drops_extremes():
    assert torch.allclose(trimmed_mean(DELTAS, 1), torch.tensor([2.5, 5.0]))
    with pytest.raises(ConfigError, match="needs more than 4"):
        trimmed_mean(DELTAS, 2)


def test_krum_picks_the_update_closest_to_its_neighbours():
    honest = torch.tensor([[0.0, 0.0], [0.1, 0.0], [0.0, 0.1], [0.1, 0.1]])
    deltas = torch.cat([honest, torch.tensor([[50.0, 50.0]])])
    scores = krum_scores(deltas, num_byzantine=1)
    assert int(scores.argmax()) == 4
    # hand-computed: client 0 has neighbours at squared distances 0.01, 0.01 (n - f - 2 = 2)
    assert scores[0].item() == pytest.approx(0.02)
    assert torch.allclose(multi_krum(deltas, 1, 4), honest.mean(0))
    with pytest.raises(ConfigError, match="at least f \\+ 3"):
        krum_scores(deltas[:3], num_byzantine=1)


def test_unknown_aggregator_lists_the_choices():
    with pytest.raises(UnknownNameError, match="available: fedavg, median"):
        make_aggregator("mean")


@settings(max_examples=40, deadline=None)
@given(
    st.integers(3, 9),
    st.integers(1, 6),
    st.sampled_from(["fedavg", "median", "trimmed_mean", "multi_krum"]),
    st.integers(0, 2**31),
)
def test_aggregators_do_not_depend_on_client_order(k, d, name, seed):
    g = torch.Generator().manual_seed(seed)
    deltas = torch.randn(k, d, generator=g, dtype=torch.float64)
    weights = torch.rand(k, generator=g, dtype=torch.float64) + 0.5
    agg = make_aggregator(name, trim=1, krum_f=0)
    perm = torch.randperm(k, generator=g)
    assert torch.allclose(agg(deltas, weights), agg(deltas[perm], weights[perm]), atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 3))
def test_median_stays_in_the_honest_range(seed, num_bad):
    g = torch.Generator().manual_seed(seed)
    honest = torch.rand(2 * num_bad + 1, 5, generator=g)
    bad = torch.full((num_bad, 5), 1e6)
    out = coordinate_median(torch.cat([honest, bad]))
    assert bool((out >= honest.min(0).values).all() and (out <= honest.max(0).values).all())
