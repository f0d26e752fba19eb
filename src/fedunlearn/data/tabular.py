"""Tabular datasets of the Mini-Unlearning paper: Covtype and HIGGS files, and look-alikes.

- ``load_covtype``: UCI Covertype ``covtype.data.gz`` (581,012 rows, 54 features, label 1..7 in
  the last column), looked for in the data dir and its ``covtype/`` sub-directory;
- ``load_higgs``: UCI HIGGS ``HIGGS.csv.gz`` (11M rows, label 0/1 in the first column, 28
  features), in the data dir or ``higgs/``; ``max_samples`` reads only the first rows;
- ``load_covtype_like`` and ``load_higgs_like``: seeded synthetic stand-ins with the same shapes
  (54 features / 7 imbalanced classes; 28 features / 2 classes, weakly separable), used when the
  real files are absent (this environment cannot download them).

Continuous features are standardised with training-split statistics (the one-hot Covtype
columns are left as they are). Files are never downloaded: the error says where to put them.

Paper: Huang et al., "Machine Unlearning with Minimal Gradient Dependence for High Unlearning
Ratios", §5 (MNIST, Covtype, HIGGS with L2-regularised logistic regression).
Deviations:
    [REC] Train/test split and subsampling are not given in the paper: a stratified split with
    ``test_fraction`` (default 0.2) and optional ``max_samples`` (first rows for HIGGS, a seeded
    subsample for Covtype).
    [REC] The look-alikes mimic shape, class balance (Covtype's class shares) and rough linear
    separability, not the real distributions; results on them are not the paper's datasets.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import numpy as np

from fedunlearn.errors import ConfigError, DataFormatError, DataUnavailableError

__all__ = [
    "COVTYPE_CLASS_SHARES",
    "load_covtype",
    "load_covtype_like",
    "load_higgs",
    "load_higgs_like",
    "split_tabular",
]

#: Class shares of the real Covtype data (classes 1..7).
COVTYPE_CLASS_SHARES = (0.3646, 0.4876, 0.0615, 0.0047, 0.0163, 0.0299, 0.0353)
COVTYPE_CONTINUOUS = 10


def _find(data_dir: Path, sub: str, filename: str) -> Path:
    for path in (data_dir / filename, data_dir / sub / filename):
        if path.is_file():
            return path
    raise DataUnavailableError(
        f"{filename} not found in {data_dir} or {data_dir / sub}; download it from the UCI "
        f"repository and put it there (or pass data_dir=...); the synthetic stand-in is "
        f"'{sub}_like'"
    )


def _read_table(
    data_dir: Path, sub: str, filename: str, max_rows: int | None, columns: int, layout: str
) -> tuple[Path, np.ndarray]:
    """Find ``filename`` (``_find``) and read its first ``max_rows`` rows (None: all).

    Raises:
        DataUnavailableError: the file is missing.
        DataFormatError: it is not a numeric table of ``columns`` columns (``layout``).
    """
    path = _find(data_dir, sub, filename)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as handle:  # type: ignore[operator]
            rows = np.loadtxt(handle, delimiter=",", max_rows=max_rows, ndmin=2)
    except (ValueError, OSError, EOFError) as err:
        raise DataFormatError(f"{path} is not a comma-separated numeric table: {err}") from None
    if rows.shape[1] != columns:
        raise DataFormatError(f"{path}: expected {columns} columns ({layout}); got {rows.shape[1]}")
    return path, rows


def split_tabular(
    x: np.ndarray,
    y: np.ndarray,
    num_classes: int,
    test_fraction: float,
    seed: int,
    standardize: int,
) -> dict[str, Any]:
    """Split stratified by class and standardise the first ``standardize`` columns.

    Returns:
        ``x_train, y_train, x_test, y_test`` as float32 / int64 arrays.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ConfigError(f"test_fraction must lie in (0, 1); got {test_fraction}")
    rng = np.random.default_rng(seed)
    is_test = np.zeros(len(y), dtype=bool)
    for label in range(num_classes):
        members = rng.permutation(np.flatnonzero(y == label))
        is_test[members[: round(len(members) * test_fraction)]] = True
    x = x.astype(np.float64)
    if standardize:
        cols = slice(0, standardize)
        mean = x[~is_test, cols].mean(axis=0)
        std = x[~is_test, cols].std(axis=0)
        x[:, cols] = (x[:, cols] - mean) / np.where(std > 0, std, 1.0)
    return {
        "x_train": x[~is_test].astype(np.float32),
        "y_train": y[~is_test].astype(np.int64),
        "x_test": x[is_test].astype(np.float32),
        "y_test": y[is_test].astype(np.int64),
    }


def _subsample(
    x: np.ndarray, y: np.ndarray, max_samples: int | None, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    if max_samples is None or max_samples >= len(y):
        return x, y
    if max_samples < 2:
        raise ConfigError(f"max_samples must be >= 2; got {max_samples}")
    keep = np.sort(np.random.default_rng([seed, 7]).choice(len(y), max_samples, replace=False))
    return x[keep], y[keep]


def load_covtype(
    *,
    data_dir: Path,
    max_samples: int | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> dict[str, Any]:
    """Read ``covtype.data.gz``: 54 feature columns, then the cover type 1..7.

    Raises:
        DataUnavailableError: the file is missing.
        DataFormatError: wrong column count or labels outside 1..7.
    """
    path, rows = _read_table(
        data_dir, "covtype", "covtype.data.gz", None, 55, "54 features + label"
    )
    labels = rows[:, -1]
    if not np.isin(labels, np.arange(1, 8)).all():
        raise DataFormatError(f"{path}: cover-type labels must lie in 1..7")
    x, y = _subsample(rows[:, :-1], labels.astype(np.int64) - 1, max_samples, seed)
    arrays = split_tabular(x, y, 7, test_fraction, seed, COVTYPE_CONTINUOUS)
    return {**arrays, "num_classes": 7, "source": str(path)}


def load_higgs(
    *,
    data_dir: Path,
    max_samples: int | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> dict[str, Any]:
    """Read ``HIGGS.csv.gz``: label 0/1, then 28 features (first ``max_samples`` rows).

    Raises:
        DataUnavailableError: the file is missing.
        DataFormatError: wrong column count or labels not 0/1.
    """
    path, rows = _read_table(
        data_dir, "higgs", "HIGGS.csv.gz", max_samples, 29, "label + 28 features"
    )
    labels = rows[:, 0]
    if not np.isin(labels, (0.0, 1.0)).all():
        raise DataFormatError(f"{path}: HIGGS labels must be 0 or 1")
    arrays = split_tabular(rows[:, 1:], labels.astype(np.int64), 2, test_fraction, seed, 28)
    return {**arrays, "num_classes": 2, "source": str(path)}


def load_covtype_like(
    *, num_samples: int = 20000, test_fraction: float = 0.2, seed: int = 0
) -> dict[str, Any]:
    """Synthetic Covtype stand-in: 10 continuous + 4 + 40 one-hot columns, 7 imbalanced classes."""
    if num_samples < 50:
        raise ConfigError(f"covtype_like: num_samples must be >= 50; got {num_samples}")
    rng = np.random.default_rng([seed, 54])
    y = rng.choice(
        7, size=num_samples, p=np.array(COVTYPE_CLASS_SHARES) / sum(COVTYPE_CLASS_SHARES)
    )
    means = rng.normal(scale=0.6, size=(7, COVTYPE_CONTINUOUS))
    cont = means[y] + rng.normal(size=(num_samples, COVTYPE_CONTINUOUS))
    wild_p = rng.dirichlet(np.full(4, 0.7), size=7)
    soil_p = rng.dirichlet(np.full(40, 0.3), size=7)
    wild = np.eye(4)[[rng.choice(4, p=wild_p[c]) for c in y]]
    soil = np.eye(40)[[rng.choice(40, p=soil_p[c]) for c in y]]
    x = np.concatenate([cont, wild, soil], axis=1)
    arrays = split_tabular(x, y, 7, test_fraction, seed, COVTYPE_CONTINUOUS)
    return {**arrays, "num_classes": 7, "source": "synthetic covtype-like"}


def load_higgs_like(
    *, num_samples: int = 20000, test_fraction: float = 0.2, seed: int = 0
) -> dict[str, Any]:
    """Synthetic HIGGS stand-in: 21 low-level + 7 derived features, 2 weakly separable classes."""
    if num_samples < 50:
        raise ConfigError(f"higgs_like: num_samples must be >= 50; got {num_samples}")
    rng = np.random.default_rng([seed, 28])
    y = rng.integers(0, 2, size=num_samples)
    shift = rng.normal(scale=0.12, size=21)
    low = rng.normal(size=(num_samples, 21)) + np.outer(2 * y - 1, shift)
    mix = rng.normal(size=(21, 7)) / np.sqrt(21)
    high = np.abs(low @ mix) + 0.25 * (2 * y - 1)[:, None] * rng.uniform(0.2, 0.6, size=7)
    x = np.concatenate([low, high], axis=1)
    arrays = split_tabular(x, y, 2, test_fraction, seed, 28)
    return {**arrays, "num_classes": 2, "source": "synthetic higgs-like"}
