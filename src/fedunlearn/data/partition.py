"""Splitting a training set among clients: iid, dirichlet, label_bias and shards.

Every scheme assigns each sample to exactly one client, so the parts are disjoint and cover
all samples (no exceptions: remainders are spread, never dropped), and every client gets at
least ``min_size`` samples (random schemes redraw, at most ``MAX_DRAWS`` times). The result
depends only on the labels, the arguments and ``seed``.

Paper: ``dirichlet``: Hsu, Qi, Brown, "Measuring the Effects of Non-Identical Data
Distribution for Federated Visual Classification", arXiv:1909.06335, §3 (per-class
proportions q ~ Dir(alpha·1)). ``label_bias``: Fang et al., "Local Model Poisoning Attacks to
Byzantine-Robust Federated Learning", USENIX Security 2020, §5.1, as used by FLTrust and
FedRecover (bias q). ``shards``: McMahan et al., "Communication-Efficient Learning of Deep
Networks from Decentralized Data", AISTATS 2017, §3 (sorted by label, 2 shards per client).

Deviations: [REC] ``dirichlet`` draws one proportion vector per class and cuts that class's
shuffled samples at the cumulative proportions, without the size-balancing some re-implementations
add. [REC] ``label_bias`` with ``num_clients`` not a multiple of the class count makes groups
that differ in size by one (contiguous client ids), instead of the fractional group width of
the reference code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import numpy as np

from fedunlearn.errors import ConfigError, UnknownNameError

__all__ = ["MAX_DRAWS", "SCHEMES", "label_histogram", "partition", "partition_sizes"]

SCHEMES = ("iid", "dirichlet", "label_bias", "shards")
#: Random draws tried before a scheme gives up on ``min_size``.
MAX_DRAWS = 1000


def partition(
    labels: np.ndarray,
    num_clients: int,
    scheme: str,
    *,
    seed: int,
    alpha: float = 0.5,
    bias: float = 0.5,
    shards_per_client: int = 2,
    min_size: int = 1,
) -> list[np.ndarray]:
    """Split sample indices ``0..len(labels)-1`` among ``num_clients`` clients.

    Schemes:
        ``iid``: shuffle, then deal round-robin; sizes differ by at most one.
        ``dirichlet``: for each class draw proportions p ~ Dir(alpha, ..., alpha) over clients
            and cut the class's shuffled samples at ``cumsum(p)``; small ``alpha`` = skewed.
        ``label_bias``: clients form ``C`` groups (C = ``labels.max() + 1``, contiguous ids); a
            sample of label l goes to group l with probability ``bias`` (q), otherwise to one of
            the other C - 1 groups uniformly; then to a uniform client of that group.
            ``bias = 1/C`` is iid-like, ``bias = 1`` gives each group one label.
        ``shards``: sort by label (stable), cut into ``num_clients * shards_per_client``
            near-equal shards and deal ``shards_per_client`` random shards to each client. A
            client then holds at most ``shards_per_client`` labels when every class size is a
            multiple of the shard size (at most twice that in general).

    Args:
        labels: Integer labels ``(N,)``, non-negative.
        num_clients: Number of clients K, ``1 <= K <= N``.
        scheme: One of ``SCHEMES``.
        seed: Seed of every random choice (non-negative).
        alpha: Dirichlet concentration, > 0 (``dirichlet``).
        bias: Probability q of a sample staying in its label's group, in [0, 1] (``label_bias``).
        shards_per_client: Shards per client, >= 1 (``shards``).
        min_size: Smallest allowed client size, >= 0, with ``K * min_size <= N``.

    Returns:
        One sorted int64 index array per client; disjoint, covering every sample.

    Raises:
        UnknownNameError: Unknown ``scheme``.
        ConfigError: A parameter is out of range, or ``min_size`` was not met in ``MAX_DRAWS``
            random draws.
    """
    labels = _check_labels(labels)
    n = len(labels)
    _check_int("num_clients", num_clients, 1)
    if num_clients > n:
        raise ConfigError(
            f"num_clients ({num_clients}) exceeds the number of samples ({n}); use at most {n}"
        )
    _check_int("min_size", min_size, 0)
    if num_clients * min_size > n:
        raise ConfigError(
            f"min_size {min_size} for {num_clients} clients needs {num_clients * min_size} "
            f"samples; only {n} exist; lower min_size to at most {n // num_clients}"
        )
    _check_int("seed", seed, 0)
    if not alpha > 0 or not np.isfinite(alpha):
        raise ConfigError(f"alpha must be a finite number > 0; got {alpha}")
    if not 0.0 <= bias <= 1.0:
        raise ConfigError(f"bias must lie in [0, 1]; got {bias}")
    _check_int("shards_per_client", shards_per_client, 1)
    if scheme not in SCHEMES:
        raise UnknownNameError(
            f"unknown partition scheme {scheme!r}; available: {', '.join(SCHEMES)}"
        )

    rng = np.random.default_rng(seed)
    num_classes = int(labels.max()) + 1
    draw: Callable[[], np.ndarray]
    if scheme == "iid":
        draw = partial(_iid, n, num_clients, rng)
    elif scheme == "dirichlet":
        draw = partial(_dirichlet, labels, num_clients, num_classes, alpha, rng)
    elif scheme == "label_bias":
        if num_clients < num_classes:
            raise ConfigError(
                f"label_bias needs at least one client per class: {num_clients} clients, "
                f"{num_classes} classes; use num_clients >= {num_classes} or another scheme"
            )
        draw = partial(_label_bias, labels, num_clients, num_classes, bias, rng)
    else:
        if n < num_clients * shards_per_client:
            raise ConfigError(
                f"shards needs at least num_clients * shards_per_client = "
                f"{num_clients * shards_per_client} samples; got {n}"
            )
        draw = partial(_shards, labels, num_clients, shards_per_client, rng)

    for _ in range(MAX_DRAWS):
        owner = draw()
        counts = np.bincount(owner, minlength=num_clients)
        if counts.min() >= min_size:
            order = np.argsort(owner, kind="stable").astype(np.int64)  # stable: parts stay sorted
            return np.split(order, np.cumsum(counts)[:-1])
    raise ConfigError(
        f"{scheme} partition left a client with fewer than {min_size} samples in {MAX_DRAWS} draws "
        f"(N={n}, num_clients={num_clients}); raise alpha or bias, lower min_size or num_clients"
    )


def partition_sizes(parts: Sequence[np.ndarray]) -> list[int]:
    """Return the number of samples of each client."""
    return [len(part) for part in parts]


def label_histogram(
    labels: np.ndarray, parts: Sequence[np.ndarray], num_classes: int | None = None
) -> np.ndarray:
    """Count each client's samples per class.

    Args:
        labels: Integer labels ``(N,)``.
        parts: Index arrays, one per client (as returned by ``partition``).
        num_classes: Number of columns; default ``labels.max() + 1``.

    Returns:
        int64 array ``(num_clients, num_classes)``.
    """
    labels = _check_labels(labels)
    columns = int(labels.max()) + 1 if num_classes is None else num_classes
    histogram = np.zeros((len(parts), columns), dtype=np.int64)
    for client, part in enumerate(parts):
        histogram[client] = np.bincount(labels[part], minlength=columns)[:columns]
    return histogram


def _iid(n: int, num_clients: int, rng: np.random.Generator) -> np.ndarray:
    owner = np.empty(n, dtype=np.int64)
    owner[rng.permutation(n)] = np.arange(n) % num_clients
    return owner


def _dirichlet(
    labels: np.ndarray, num_clients: int, num_classes: int, alpha: float, rng: np.random.Generator
) -> np.ndarray:
    owner = np.empty(len(labels), dtype=np.int64)
    for label in range(num_classes):
        members = rng.permutation(np.flatnonzero(labels == label))
        proportions = rng.dirichlet(np.full(num_clients, alpha))
        # Cut points at the cumulative proportions (Hsu et al. §3).
        cuts = np.floor(np.cumsum(proportions)[:-1] * len(members)).astype(np.int64)
        counts = np.diff(np.concatenate([[0], np.clip(cuts, 0, len(members)), [len(members)]]))
        owner[members] = np.repeat(np.arange(num_clients), counts)
    return owner


def _label_bias(
    labels: np.ndarray, num_clients: int, num_classes: int, bias: float, rng: np.random.Generator
) -> np.ndarray:
    n = len(labels)
    # Group g holds clients starts[g] .. starts[g] + widths[g] - 1.
    widths = np.array([len(g) for g in np.array_split(np.arange(num_clients), num_classes)])
    starts = np.concatenate([[0], np.cumsum(widths)[:-1]])
    other = rng.integers(0, max(num_classes - 1, 1), size=n)
    other = np.where(other >= labels, other + 1, other) if num_classes > 1 else labels
    group = np.where(rng.random(n) < bias, labels, other)
    return starts[group] + np.floor(rng.random(n) * widths[group]).astype(np.int64)


def _shards(
    labels: np.ndarray, num_clients: int, shards_per_client: int, rng: np.random.Generator
) -> np.ndarray:
    shards = np.array_split(np.argsort(labels, kind="stable"), num_clients * shards_per_client)
    owner = np.empty(len(labels), dtype=np.int64)
    for position, shard in enumerate(rng.permutation(len(shards))):
        owner[shards[shard]] = position // shards_per_client
    return owner


def _check_labels(labels: np.ndarray) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ConfigError(
            f"labels must be a 1-D integer array; got dtype {labels.dtype}, shape {labels.shape}"
        )
    if labels.size == 0:
        raise ConfigError("labels is empty; there is nothing to partition")
    if labels.min() < 0:
        raise ConfigError(f"labels must be non-negative; got minimum {int(labels.min())}")
    return labels.astype(np.int64, copy=False)


def _check_int(name: str, value: int, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ConfigError(f"{name} must be an integer >= {low}; got {value!r}")
