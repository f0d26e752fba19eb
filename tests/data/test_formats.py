from __future__ import annotations

import collections
import gzip
import pickle

import numpy as np
import pytest

from fedunlearn.data import formats
from fedunlearn.errors import DataFormatError


@pytest.mark.parametrize("gz", [True, False])
def test_read_idx_round_trips_images_and_labels(tmp_path, mnist_arrays, idx_encoder, gz):
    images, labels = tmp_path / "images", tmp_path / "labels"
    images.write_bytes(idx_encoder(mnist_arrays["x_train"], gz=gz))
    labels.write_bytes(idx_encoder(mnist_arrays["y_train"], gz=gz))

    x = formats.read_idx(images, ndim=3)
    y = formats.read_idx(labels, ndim=1)

    np.testing.assert_array_equal(x, mnist_arrays["x_train"])
    np.testing.assert_array_equal(y, mnist_arrays["y_train"])
    assert x.dtype == np.uint8
    assert x.shape == (20, 28, 28)


def test_read_idx_decodes_big_endian_multibyte_types(tmp_path, idx_encoder):
    values = np.array([[1, -2, 70000], [2**30, 0, -(2**31)]], dtype=np.int32)
    path = tmp_path / "ints.idx"
    path.write_bytes(idx_encoder(values, gz=False))

    out = formats.read_idx(path, ndim=2)

    np.testing.assert_array_equal(out, values)
    assert out.dtype.isnative


def test_read_idx_rejects_bad_magic_and_names_the_file(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(b"\x12\x34\x08\x03" + bytes(100))

    with pytest.raises(DataFormatError, match="not an IDX file") as info:
        formats.read_idx(path, ndim=3)

    assert str(path) in str(info.value)


def test_read_idx_rejects_wrong_number_of_dimensions(tmp_path, mnist_arrays, idx_encoder):
    path = tmp_path / "labels.gz"
    path.write_bytes(idx_encoder(mnist_arrays["y_train"]))

    with pytest.raises(DataFormatError, match="1 dimensions; expected 3"):
        formats.read_idx(path, ndim=3)


def test_read_idx_rejects_truncated_data(tmp_path, mnist_arrays, idx_encoder):
    raw = idx_encoder(mnist_arrays["x_train"], gz=False)
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(raw[:-5]))

    with pytest.raises(DataFormatError, match="truncated") as info:
        formats.read_idx(path, ndim=3)

    assert str(path) in str(info.value)


def test_read_idx_rejects_truncated_gzip_stream(tmp_path, mnist_arrays, idx_encoder):
    blob = idx_encoder(mnist_arrays["x_train"])
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(blob[: len(blob) // 2])

    with pytest.raises(DataFormatError, match="damaged gzip") as info:
        formats.read_idx(path, ndim=3)

    assert str(path) in str(info.value)


def test_read_idx_rejects_trailing_bytes(tmp_path, mnist_arrays, idx_encoder):
    path = tmp_path / "labels"
    path.write_bytes(idx_encoder(mnist_arrays["y_train"], gz=False) + b"\x00")

    with pytest.raises(DataFormatError, match="trailing bytes"):
        formats.read_idx(path, ndim=1)


def test_read_npz_reports_missing_arrays(tmp_path):
    path = tmp_path / "mnist.npz"
    np.savez(path, x_train=np.zeros((2, 28, 28), np.uint8), y_train=np.zeros(2, np.uint8))

    with pytest.raises(DataFormatError, match="missing array\\(s\\) x_test, y_test"):
        formats.read_npz(path, ("x_train", "y_train", "x_test", "y_test"))


def test_read_npz_rejects_a_file_that_is_not_npz(tmp_path):
    path = tmp_path / "mnist.npz"
    path.write_bytes(b"PK\x03\x04 this zip is cut short")

    with pytest.raises(DataFormatError, match="not a readable .npz"):
        formats.read_npz(path, ("x_train",))


def test_cifar_folder_and_archive_give_the_same_arrays(
    tmp_path, cifar_arrays, write_cifar_folder, write_cifar_tar
):
    folder = write_cifar_folder(tmp_path / "a")
    archive = write_cifar_tar(tmp_path / "b")

    from_folder = formats.read_cifar_folder(folder)
    from_archive = formats.read_cifar_archive(archive)

    for split in ("train", "test"):
        x, y = from_folder[split]
        np.testing.assert_array_equal(x, from_archive[split][0])
        np.testing.assert_array_equal(y, from_archive[split][1])
        np.testing.assert_array_equal(y, cifar_arrays[f"y_{split}"])
        assert x.shape == (len(y), 3, 32, 32)
    # Row layout: 1024 red values, then green, then blue.
    row = cifar_arrays["x_train"][0]
    np.testing.assert_array_equal(from_folder["train"][0][0, 1].ravel(), row[1024:2048])


def test_cifar_archive_missing_member_is_named(tmp_path, write_cifar_tar):
    archive = write_cifar_tar(tmp_path, drop=("data_batch_3",))

    with pytest.raises(DataFormatError, match="data_batch_3"):
        formats.read_cifar_archive(archive)


def test_cifar_archive_damaged_raises_data_format_error(tmp_path, write_cifar_tar):
    archive = write_cifar_tar(tmp_path)
    blob = archive.read_bytes()
    archive.write_bytes(blob[: len(blob) // 2])

    with pytest.raises(DataFormatError, match="cifar-10-python.tar.gz"):
        formats.read_cifar_archive(archive)


def test_cifar_batch_with_foreign_global_is_refused(tmp_path, write_cifar_folder):
    folder = write_cifar_folder(tmp_path)
    batch = {
        b"data": np.zeros((1, 3072), np.uint8),
        b"labels": [0],
        b"x": collections.OrderedDict(),
    }
    (folder / "data_batch_2").write_bytes(pickle.dumps(batch, protocol=2))

    with pytest.raises(DataFormatError, match="refusing to load global collections.OrderedDict"):
        formats.read_cifar_folder(folder)


def test_cifar_batch_with_wrong_row_size_is_rejected(tmp_path, write_cifar_folder):
    folder = write_cifar_folder(tmp_path)
    batch = {b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}
    (folder / "test_batch").write_bytes(pickle.dumps(batch))

    with pytest.raises(DataFormatError, match="test_batch: 'data' must be a uint8 array"):
        formats.read_cifar_folder(folder)


@pytest.mark.parametrize(
    ("shape", "layout"),
    [((4, 32, 32, 3), "nhwc"), ((4, 3, 32, 32), "nchw")],
)
def test_to_images_accepts_channels_last_and_first(shape, layout):
    x = np.random.default_rng(0).integers(0, 256, size=shape, dtype=np.uint8)

    out = formats.to_images(x, (3, 32, 32), "test")

    expected = x.transpose(0, 3, 1, 2) if layout == "nhwc" else x
    assert out.dtype == np.float32
    assert out.shape == (4, 3, 32, 32)
    np.testing.assert_allclose(out, expected / 255.0, rtol=1e-6)
    assert out.flags.c_contiguous


def test_to_images_adds_the_channel_of_grayscale_images():
    x = np.full((2, 28, 28), 255, dtype=np.uint8)

    out = formats.to_images(x, (1, 28, 28), "test")

    assert out.shape == (2, 1, 28, 28)
    assert out.max() == 1.0


@pytest.mark.parametrize(
    ("x", "message"),
    [
        (np.zeros((2, 27, 28), np.uint8), "expected \\(N, 1, 28, 28\\)"),
        (np.full((2, 28, 28), 2.0, np.float32), "must lie in \\[0, 1\\]"),
        (np.zeros((2, 28, 28), np.int32), "dtype int32"),
    ],
)
def test_to_images_rejects_bad_input(x, message):
    with pytest.raises(DataFormatError, match=message):
        formats.to_images(x, (1, 28, 28), "file.npz")


def test_to_labels_flattens_column_and_checks_range():
    assert formats.to_labels(np.array([[1], [2]], np.uint8), 10, "f").tolist() == [1, 2]
    assert formats.to_labels(np.array([3], np.uint8), 10, "f").dtype == np.int64
    with pytest.raises(DataFormatError, match="labels range over 0..10; expected 0..9"):
        formats.to_labels(np.array([0, 10]), 10, "f")
