from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedunlearn.data import label_histogram, partition, partition_sizes
from fedunlearn.data.partition import SCHEMES
from fedunlearn.errors import ConfigError, UnknownNameError

LABELS = np.repeat(np.arange(10), 50)  # 500 samples, 10 balanced classes


def assert_is_partition(parts: list[np.ndarray], n: int) -> None:
    for part in parts:
        assert part.dtype == np.int64
        assert np.all(np.diff(part) > 0)  # sorted, no repeats
    everything = np.concatenate(parts)
    assert len(everything) == n
    np.testing.assert_array_equal(np.sort(everything), np.arange(n))


def mean_label_entropy(labels: np.ndarray, parts: list[np.ndarray]) -> float:
    histogram = label_histogram(labels, parts).astype(float)
    p = histogram / histogram.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log(p), 0.0)
    return float(terms.sum(axis=1).mean())


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_returns_a_sorted_disjoint_cover(scheme):
    parts = partition(LABELS, 10, scheme, seed=0)

    assert len(parts) == 10
    assert_is_partition(parts, len(LABELS))
    assert min(partition_sizes(parts)) >= 1


@pytest.mark.parametrize("scheme", SCHEMES)
def test_same_seed_same_parts_and_other_seed_other_parts(scheme):
    a = partition(LABELS, 10, scheme, seed=7)
    b = partition(LABELS, 10, scheme, seed=7)
    c = partition(LABELS, 10, scheme, seed=8)

    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_iid_sizes_differ_by_at_most_one():
    sizes = partition_sizes(partition(np.zeros(103, np.int64), 10, "iid", seed=0))

    assert sum(sizes) == 103
    assert max(sizes) - min(sizes) == 1


def test_dirichlet_small_alpha_is_more_skewed_than_large_alpha():
    skewed = [
        mean_label_entropy(LABELS, partition(LABELS, 10, "dirichlet", seed=s, alpha=0.1))
        for s in range(3)
    ]
    even = [
        mean_label_entropy(LABELS, partition(LABELS, 10, "dirichlet", seed=s, alpha=100.0))
        for s in range(3)
    ]

    assert max(skewed) < min(even)
    assert min(even) > 0.9 * np.log(10)  # alpha=100 is close to iid


def test_dirichlet_redraws_until_min_size_holds():
    first_draw = partition(LABELS, 20, "dirichlet", seed=0, alpha=0.1, min_size=0)
    parts = partition(LABELS, 20, "dirichlet", seed=0, alpha=0.1, min_size=3)

    assert min(partition_sizes(first_draw)) < 3  # so the second call had to redraw
    assert min(partition_sizes(parts)) >= 3
    assert_is_partition(parts, len(LABELS))


def test_dirichlet_gives_up_with_config_error_after_bounded_draws():
    labels = np.repeat(np.arange(10), 10)

    with pytest.raises(ConfigError, match="fewer than 10 samples in 1000 draws"):
        partition(labels, 10, "dirichlet", seed=0, alpha=0.01, min_size=10)


def test_label_bias_with_q_one_keeps_each_label_in_its_group():
    parts = partition(LABELS, 20, "label_bias", seed=0, bias=1.0)  # groups of 2 clients

    histogram = label_histogram(LABELS, parts)
    for client, row in enumerate(histogram):
        assert np.flatnonzero(row).tolist() == [client // 2]


def test_label_bias_with_q_zero_never_uses_the_own_group():
    parts = partition(LABELS, 10, "label_bias", seed=0, bias=0.0)

    histogram = label_histogram(LABELS, parts)
    assert np.all(np.diag(histogram) == 0)
    assert histogram.sum() == len(LABELS)


def test_label_bias_share_of_own_label_follows_q():
    labels = np.repeat(np.arange(10), 400)
    parts = partition(labels, 10, "label_bias", seed=0, bias=0.5)

    own_share = np.trace(label_histogram(labels, parts)) / len(labels)

    assert abs(own_share - 0.5) < 0.03


def test_shards_give_each_client_at_most_shards_per_client_labels():
    labels = np.repeat(np.arange(10), 20)  # 20 shards of 10: one label per shard

    parts = partition(labels, 10, "shards", seed=0, shards_per_client=2)

    distinct = (label_histogram(labels, parts) > 0).sum(axis=1)
    assert distinct.max() <= 2
    assert partition_sizes(parts) == [20] * 10


def test_label_histogram_rows_add_up_to_sizes():
    parts = partition(LABELS, 7, "dirichlet", seed=1)

    histogram = label_histogram(LABELS, parts, num_classes=12)

    assert histogram.shape == (7, 12)
    assert histogram.dtype == np.int64
    assert histogram.sum(axis=1).tolist() == partition_sizes(parts)
    assert histogram[:, 10:].sum() == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_clients": 0}, "num_clients must be an integer >= 1; got 0"),
        ({"num_clients": 501}, "num_clients \\(501\\) exceeds the number of samples \\(500\\)"),
        ({"alpha": 0.0}, "alpha must be a finite number > 0; got 0.0"),
        ({"alpha": -1.0}, "alpha must be"),
        ({"bias": 1.5}, "bias must lie in \\[0, 1\\]; got 1.5"),
        ({"bias": -0.1}, "bias must lie in"),
        ({"min_size": 51}, "lower min_size to at most 50"),
        ({"shards_per_client": 0}, "shards_per_client must be an integer >= 1"),
        ({"seed": -3}, "seed must be an integer >= 0"),
        (
            {"scheme": "label_bias", "num_clients": 5},
            "label_bias needs at least one client per class",
        ),
        ({"scheme": "shards", "num_clients": 250, "shards_per_client": 3}, "shards needs at least"),
    ],
)
def test_invalid_arguments_raise_config_error(kwargs, message):
    arguments = {"num_clients": 10, "scheme": "dirichlet", "seed": 0, **kwargs}

    with pytest.raises(ConfigError, match=message):
        partition(LABELS, **arguments)


@pytest.mark.parametrize(
    "labels",
    [np.array([0.0, 1.0]), np.array([[0, 1]]), np.array([], np.int64), np.array([0, -1])],
)
def test_invalid_labels_raise_config_error(labels):
    with pytest.raises(ConfigError, match="labels"):
        partition(labels, 1, "iid", seed=0)


def test_unknown_scheme_lists_the_known_ones():
    with pytest.raises(
        UnknownNameError, match="unknown partition scheme 'noniid'; available: iid, dirichlet"
    ):
        partition(LABELS, 10, "noniid", seed=0)


@st.composite
def partition_cases(draw):
    num_classes = draw(st.integers(1, 6))
    n = draw(st.integers(max(num_classes, 2), 120))
    labels = np.array(draw(st.lists(st.integers(0, num_classes - 1), min_size=n, max_size=n)))
    labels[:num_classes] = np.arange(num_classes)  # every class present
    scheme = draw(st.sampled_from(SCHEMES))
    low = num_classes if scheme == "label_bias" else 1
    num_clients = draw(st.integers(low, max(low, min(n // 2, 15))))
    return labels, num_clients, scheme, draw(st.integers(0, 2**32))


@settings(max_examples=150, deadline=None)
@given(partition_cases())
@pytest.mark.slow
def test_property_parts_are_disjoint_and_cover_every_sample(case):
    labels, num_clients, scheme, seed = case

    parts = partition(labels, num_clients, scheme, seed=seed, alpha=0.3, min_size=0)

    assert len(parts) == num_clients
    assert_is_partition(parts, len(labels))
