"""Covtype / HIGGS loaders on generated fixture files, and the synthetic look-alikes."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from fedunlearn.data.datasets import load_dataset
from fedunlearn.errors import DataFormatError, DataUnavailableError


def write_covtype(path, n=70, columns=55, labels=None):
    rng = np.random.default_rng(0)
    cont = rng.integers(0, 3000, size=(n, 10))
    onehot = np.zeros((n, 44), dtype=int)
    onehot[np.arange(n), rng.integers(0, 4, n)] = 1
    onehot[np.arange(n), 4 + rng.integers(0, 40, n)] = 1
    y = np.arange(n) % 7 + 1 if labels is None else labels
    rows = np.concatenate([cont, onehot, y[:, None]], 1)[:, :columns]
    with gzip.open(path, "wt") as handle:
        for row in rows:
            handle.write(",".join(str(v) for v in row) + "\n")


def write_higgs(path, n=40):
    rng = np.random.default_rng(1)
    with gzip.open(path, "wt") as handle:
        for i in range(n):
            feats = ",".join(f"{v:.6e}" for v in rng.normal(size=28))
            handle.write(f"{float(i % 2):.18e},{feats}\n")


def test_covtype_fixture(tmp_path):
    (tmp_path / "covtype").mkdir()
    write_covtype(tmp_path / "covtype" / "covtype.data.gz")
    data = load_dataset("covtype", data_dir=tmp_path, download=False, test_fraction=0.2)
    assert data.kind == "tabular"
    assert data.input_shape == (54,)
    assert data.num_classes == 7
    assert len(data.y_train) + len(data.y_test) == 70
    assert len(data.y_test) == 14
    assert set(np.unique(data.y_train)) == set(range(7))
    assert abs(float(data.x_train[:, :10].mean())) < 1e-5  # standardised continuous columns
    assert set(np.unique(data.x_train[:, 10:])) <= {0.0, 1.0}  # one-hot left alone
    sub = load_dataset("covtype", data_dir=tmp_path, download=False, max_samples=35)
    assert len(sub.y_train) + len(sub.y_test) == 35


def test_higgs_fixture_and_max_samples(tmp_path):
    write_higgs(tmp_path / "HIGGS.csv.gz")
    data = load_dataset("higgs", data_dir=tmp_path, download=False, max_samples=30)
    assert data.input_shape == (28,)
    assert data.num_classes == 2
    assert len(data.y_train) + len(data.y_test) == 30


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(DataUnavailableError, match="covtype_like"):
        load_dataset("covtype", data_dir=tmp_path, download=False)
    write_covtype(tmp_path / "covtype.data.gz", columns=50)
    with pytest.raises(DataFormatError, match="55 columns"):
        load_dataset("covtype", data_dir=tmp_path, download=False)
    write_covtype(tmp_path / "covtype.data.gz", labels=np.full(70, 9))
    with pytest.raises(DataFormatError, match="1..7"):
        load_dataset("covtype", data_dir=tmp_path, download=False)


@pytest.mark.parametrize(
    ("name", "features", "classes"), [("covtype_like", 54, 7), ("higgs_like", 28, 2)]
)
def test_lookalikes_shape_and_determinism(name, features, classes):
    a = load_dataset(name, num_samples=500, seed=3)
    b = load_dataset(name, num_samples=500, seed=3)
    assert a.input_shape == (features,)
    assert a.num_classes == classes
    assert np.array_equal(a.x_train, b.x_train)
    assert np.array_equal(a.y_test, b.y_test)
    assert 390 <= len(a.y_train) <= 410  # stratified rounding per class
