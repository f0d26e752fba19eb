from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fedunlearn.data as data
import fedunlearn.data.datasets as datasets
from fedunlearn.data import DATASETS, Dataset, load_dataset
from fedunlearn.data.datasets import resolve_data_dir
from fedunlearn.errors import ConfigError, DataFormatError, DataUnavailableError, UnknownNameError

REAL_MNIST = Path("/work/shared/data/mnist.npz")


def test_every_exported_name_imports_and_registry_lists_all_datasets():
    assert all(hasattr(data, name) for name in data.__all__)
    assert set(DATASETS) == {
        "digits", "mnist", "fashion-mnist", "cifar10", "ag_news", "synthetic",
        "covtype", "higgs", "covtype_like", "higgs_like",
    }  # fmt: skip


@pytest.mark.slow
def test_importing_the_package_does_not_import_sklearn_or_rich():
    # and loading digits does not either (about 2 s of CPU in every CLI and Flower process)
    code = (
        "import sys, fedunlearn.data; print('sklearn' in sys.modules, 'rich' in sys.modules); "
        "fedunlearn.data.load_dataset('digits'); print('sklearn' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]


def test_unknown_dataset_lists_the_available_ones():
    with pytest.raises(
        UnknownNameError, match="unknown dataset 'mnst'; available: ag_news, cifar10"
    ):
        load_dataset("mnst")


def test_unknown_option_is_a_config_error_naming_the_valid_ones():
    with pytest.raises(
        ConfigError, match="has no option 'vocab_size'; its options are: seed, test_fraction"
    ):
        load_dataset("digits", vocab_size=3)


def test_digits_shapes_dtypes_and_range():
    ds = load_dataset("digits")

    assert (ds.kind, ds.input_shape, ds.num_classes) == ("image", (1, 8, 8), 10)
    assert ds.x_train.dtype == np.float32
    assert ds.y_train.dtype == np.int64
    assert len(ds.y_train) + len(ds.y_test) == 1797
    assert 0.0 <= ds.x_train.min()
    assert ds.x_train.max() == 1.0
    assert "digits" in repr(ds)
    assert "1797" not in repr(ds)
    assert "array" not in repr(ds)


def test_digits_read_from_the_file_are_sklearns_loader_bit_for_bit(monkeypatch):
    fast = load_dataset("digits")
    monkeypatch.setattr(datasets, "_digits_csv", lambda: None)  # scikit-learn's own loader
    slow = load_dataset("digits")

    for name in ("x_train", "y_train", "x_test", "y_test"):
        got, want = getattr(fast, name), getattr(slow, name)
        assert got.dtype == want.dtype, name
        assert got.tobytes() == want.tobytes(), name
    assert fast.meta == slow.meta


def test_digits_split_is_stratified_and_seeded():
    a = load_dataset("digits", seed=0, test_fraction=0.2)
    b = load_dataset("digits", seed=0, test_fraction=0.2)
    c = load_dataset("digits", seed=1, test_fraction=0.2)

    np.testing.assert_array_equal(a.x_test, b.x_test)
    assert not np.array_equal(a.x_test, c.x_test)
    per_class_test = np.bincount(a.y_test, minlength=10)
    per_class_all = per_class_test + np.bincount(a.y_train, minlength=10)
    np.testing.assert_array_equal(per_class_test, np.round(per_class_all * 0.2).astype(int))


def test_digits_rejects_bad_test_fraction_and_seed():
    with pytest.raises(ConfigError, match="test_fraction must lie in \\(0, 1\\); got 1.0"):
        load_dataset("digits", test_fraction=1.0)
    with pytest.raises(ConfigError, match="seed must be a non-negative integer"):
        load_dataset("digits", seed=-1)


def test_synthetic_is_deterministic_balanced_and_learnable():
    a = load_dataset("synthetic", num_samples=400, num_features=5, num_classes=4, seed=3)
    b = load_dataset("synthetic", num_samples=400, num_features=5, num_classes=4, seed=3)
    c = load_dataset("synthetic", num_samples=400, num_features=5, num_classes=4, seed=4)

    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert not np.array_equal(a.x_train, c.x_train)
    assert a.x_train.dtype == np.float32
    assert a.input_shape == (5,)
    assert a.kind == "tabular"
    counts = np.bincount(np.concatenate([a.y_train, a.y_test]))
    assert counts.tolist() == [100, 100, 100, 100]
    # Nearest class mean (estimated on train) beats chance by far on test.
    means = np.stack([a.x_train[a.y_train == k].mean(0) for k in range(4)])
    predicted = np.argmin(((a.x_test[:, None] - means) ** 2).sum(-1), axis=1)
    assert (predicted == a.y_test).mean() > 0.6


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_samples": 1}, "num_samples must be >= 2"),
        ({"num_classes": 1}, "num_classes must lie in 2..num_samples"),
        ({"separation": -1.0}, "separation must be >= 0"),
    ],
)
def test_synthetic_rejects_bad_options(options, message):
    with pytest.raises(ConfigError, match=message):
        load_dataset("synthetic", **options)


@pytest.mark.parametrize(("subdir", "gz"), [("mnist", True), ("MNIST/raw", True), ("", False)])
def test_mnist_from_idx_files_round_trips_values(tmp_path, mnist_arrays, write_idx_dir, subdir, gz):
    write_idx_dir(tmp_path / subdir if subdir else tmp_path, gz=gz)

    ds = load_dataset("mnist", data_dir=tmp_path, download=False)

    assert ds.x_train.shape == (20, 1, 28, 28)
    assert ds.x_test.shape == (8, 1, 28, 28)
    assert ds.x_train.dtype == np.float32
    assert ds.y_test.dtype == np.int64
    np.testing.assert_array_equal(
        np.rint(ds.x_train[:, 0] * 255).astype(np.uint8), mnist_arrays["x_train"]
    )
    np.testing.assert_array_equal(ds.y_test, mnist_arrays["y_test"])
    assert ds.meta["source"] == str(tmp_path / subdir if subdir else tmp_path)


def test_mnist_npz_takes_precedence_over_idx(tmp_path, mnist_arrays, write_idx_dir):
    write_idx_dir(tmp_path / "mnist")
    np.savez(tmp_path / "mnist.npz", **{k: v[:5] for k, v in mnist_arrays.items()})

    ds = load_dataset("mnist", data_dir=tmp_path, download=False)

    assert len(ds.y_train) == 5
    assert ds.meta["source"] == str(tmp_path / "mnist.npz")
    np.testing.assert_allclose(ds.x_test[:, 0], mnist_arrays["x_test"][:5] / 255.0, rtol=1e-6)


def test_fashion_mnist_reads_its_own_subfolder(tmp_path, mnist_arrays, write_idx_dir):
    write_idx_dir(tmp_path / "fashion-mnist")

    ds = load_dataset("fashion-mnist", data_dir=tmp_path, download=False)

    assert ds.name == "fashion-mnist"
    assert ds.meta["classes"][0] == "T-shirt/top"
    np.testing.assert_array_equal(ds.y_train, mnist_arrays["y_train"])
    with pytest.raises(DataUnavailableError):  # the fashion-mnist folder is not MNIST
        load_dataset("mnist", data_dir=tmp_path, download=False)


def test_mnist_image_label_count_mismatch_is_a_format_error(
    tmp_path, mnist_arrays, write_idx_dir, idx_encoder
):
    folder = write_idx_dir(tmp_path / "mnist")
    (folder / "train-labels-idx1-ubyte.gz").write_bytes(idx_encoder(mnist_arrays["y_train"][:19]))

    with pytest.raises(
        DataFormatError, match="20 images but .*train-labels-idx1-ubyte.gz 19 labels"
    ):
        load_dataset("mnist", data_dir=tmp_path, download=False)


def test_cifar10_folder_archive_and_npz_agree(
    tmp_path, cifar_arrays, write_cifar_folder, write_cifar_tar
):
    write_cifar_folder(tmp_path / "a")
    write_cifar_tar(tmp_path / "b" / "cifar10")
    nhwc = cifar_arrays["x_train"].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    test_nhwc = cifar_arrays["x_test"].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    (tmp_path / "c").mkdir()
    np.savez(
        tmp_path / "c" / "cifar10.npz",
        x_train=nhwc,
        y_train=cifar_arrays["y_train"][:, None],  # Keras layout (N, 1)
        x_test=test_nhwc,
        y_test=cifar_arrays["y_test"],
    )

    loaded = [load_dataset("cifar10", data_dir=tmp_path / d, download=False) for d in "abc"]

    for ds in loaded:
        assert ds.input_shape == (3, 32, 32)
        assert ds.x_train.shape == (20, 3, 32, 32)
        np.testing.assert_array_equal(ds.x_train, loaded[0].x_train)
        np.testing.assert_array_equal(ds.y_train, cifar_arrays["y_train"])
        np.testing.assert_array_equal(ds.y_test, cifar_arrays["y_test"])
    assert loaded[1].meta["source"].endswith("cifar-10-python.tar.gz")


def test_data_dir_is_argument_then_env_then_home_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_data_dir() == tmp_path / "home" / ".cache" / "fedunlearn"
    monkeypatch.setenv("FEDUNLEARN_DATA", str(tmp_path / "env"))
    assert resolve_data_dir() == tmp_path / "env"
    assert resolve_data_dir(tmp_path / "arg") == tmp_path / "arg"


def test_env_data_dir_is_used_by_load_dataset(tmp_path, monkeypatch, write_idx_dir):
    write_idx_dir(tmp_path / "mnist")
    monkeypatch.setenv("FEDUNLEARN_DATA", str(tmp_path))

    ds = load_dataset("mnist", download=False)

    assert ds.meta["source"] == str(tmp_path / "mnist")


def test_missing_files_without_download_say_what_to_put_where(tmp_path, no_network):
    with pytest.raises(DataUnavailableError) as info:
        load_dataset("mnist", data_dir=tmp_path, download=False)

    message = str(info.value)
    for expected in (
        "train-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
        f"into {tmp_path / 'mnist'}",
        str(tmp_path / "mnist.npz"),
        "FEDUNLEARN_DATA",
        "--data-dir",
        "downloading is off",
    ):
        assert expected in message
    assert no_network == []
    assert list(tmp_path.iterdir()) == []


def test_download_env_switch_turns_downloads_off(tmp_path, monkeypatch, no_network):
    monkeypatch.setenv("FEDUNLEARN_DOWNLOAD", "0")

    with pytest.raises(DataUnavailableError, match="downloading is off"):
        load_dataset("cifar10", data_dir=tmp_path)

    assert no_network == []


def test_dataset_rejects_inconsistent_arrays():
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(DataFormatError, match="x has dtype float64"):
        Dataset(
            "t",
            x.astype(np.float64),
            np.zeros(3, np.int64),
            x,
            np.zeros(3, np.int64),
            2,
            (4,),
            "tabular",
        )
    with pytest.raises(DataFormatError, match="labels must lie in 0..1"):
        Dataset("t", x, np.array([0, 1, 2]), x, np.zeros(3, np.int64), 2, (4,), "tabular")
    with pytest.raises(DataFormatError, match="kind must be one of"):
        Dataset("t", x, np.zeros(3, np.int64), x, np.zeros(3, np.int64), 2, (4,), "audio")


@pytest.mark.slow
def test_real_mnist_loads_with_expected_shapes():
    if not REAL_MNIST.is_file():
        pytest.skip(f"{REAL_MNIST} not present")

    ds = load_dataset("mnist", data_dir=REAL_MNIST.parent, download=False)

    assert ds.x_train.shape == (60000, 1, 28, 28)
    assert ds.x_test.shape == (10000, 1, 28, 28)
    assert np.bincount(ds.y_train).tolist()[:2] == [5923, 6742]
    assert ds.x_train.max() == 1.0
    assert ds.x_train.min() == 0.0
