"""Fixtures for the data tests: tiny dataset files written into tmp_path, and no network."""

from __future__ import annotations

import gzip
import io
import pickle
import struct
import tarfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

IDX_NAMES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
_IDX_CODES = {"u1": 0x08, "i1": 0x09, ">i2": 0x0B, ">i4": 0x0C, ">f4": 0x0D, ">f8": 0x0E}


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make every urlopen fail as on an offline machine; return the list of URLs tried."""
    tried: list[str] = []

    def offline(request: urllib.request.Request | str, *args: object, **kwargs: object) -> None:
        url = request if isinstance(request, str) else request.full_url
        tried.append(url)
        raise urllib.error.URLError("offline test machine")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    monkeypatch.delenv("FEDUNLEARN_DATA", raising=False)
    monkeypatch.delenv("FEDUNLEARN_DOWNLOAD", raising=False)
    return tried


def idx_bytes(array: np.ndarray, *, gz: bool = True) -> bytes:
    """Encode ``array`` as an IDX file (big-endian), gzipped unless ``gz`` is False."""
    dtype = array.dtype.newbyteorder(">") if array.dtype.itemsize > 1 else array.dtype
    code = _IDX_CODES[dtype.str.replace("|", "")]
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    raw = header + array.astype(dtype).tobytes()
    return gzip.compress(raw, mtime=0) if gz else raw


@pytest.fixture
def mnist_arrays() -> dict[str, np.ndarray]:
    """20 train and 8 test uint8 images (28x28) with labels 0..9."""
    rng = np.random.default_rng(0)
    return {
        "x_train": rng.integers(0, 256, size=(20, 28, 28), dtype=np.uint8),
        "y_train": (np.arange(20) % 10).astype(np.uint8),
        "x_test": rng.integers(0, 256, size=(8, 28, 28), dtype=np.uint8),
        "y_test": (np.arange(8) % 10).astype(np.uint8),
    }


@pytest.fixture
def write_idx_dir(mnist_arrays: dict[str, np.ndarray]) -> Callable[..., Path]:
    """Write the four MNIST IDX files into a folder; return the folder."""

    def write(folder: Path, *, gz: bool = True) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        for key, stem in IDX_NAMES.items():
            name = f"{stem}.gz" if gz else stem
            (folder / name).write_bytes(idx_bytes(mnist_arrays[key], gz=gz))
        return folder

    return write


@pytest.fixture
def cifar_arrays() -> dict[str, np.ndarray]:
    """Five train batches of 4 and one test batch of 3 CIFAR rows (uint8, 3072 per image)."""
    rng = np.random.default_rng(1)
    return {
        "x_train": rng.integers(0, 256, size=(20, 3072), dtype=np.uint8),
        "y_train": np.arange(20) % 10,
        "x_test": rng.integers(0, 256, size=(3, 3072), dtype=np.uint8),
        "y_test": np.array([9, 0, 5]),
    }


def cifar_batch_bytes(data: np.ndarray, labels: np.ndarray, protocol: int = 2) -> bytes:
    """Pickle one batch the way the CIFAR-10 python distribution does (byte-string keys)."""
    return pickle.dumps({b"data": data, b"labels": [int(v) for v in labels]}, protocol=protocol)


def cifar_members(arrays: dict[str, np.ndarray]) -> dict[str, bytes]:
    """Return member file name -> pickled batch for the 5 train batches and the test batch."""
    members = {}
    for i in range(5):
        rows = slice(4 * i, 4 * i + 4)
        members[f"data_batch_{i + 1}"] = cifar_batch_bytes(
            arrays["x_train"][rows], arrays["y_train"][rows], protocol=2 if i % 2 else 5
        )
    members["test_batch"] = cifar_batch_bytes(arrays["x_test"], arrays["y_test"])
    return members


@pytest.fixture
def write_cifar_folder(cifar_arrays: dict[str, np.ndarray]) -> Callable[[Path], Path]:
    """Write ``cifar-10-batches-py/`` under a directory; return the batches folder."""

    def write(root: Path) -> Path:
        folder = root / "cifar-10-batches-py"
        folder.mkdir(parents=True)
        for name, blob in cifar_members(cifar_arrays).items():
            (folder / name).write_bytes(blob)
        return folder

    return write


@pytest.fixture
def write_cifar_tar(cifar_arrays: dict[str, np.ndarray]) -> Callable[..., Path]:
    """Write ``cifar-10-python.tar.gz`` (optionally without some members); return its path."""

    def write(root: Path, *, drop: tuple[str, ...] = ()) -> Path:
        root.mkdir(parents=True, exist_ok=True)
        path = root / "cifar-10-python.tar.gz"
        with tarfile.open(path, "w:gz") as archive:
            readme = b"not a batch"
            info = tarfile.TarInfo("cifar-10-batches-py/readme.html")
            info.size = len(readme)
            archive.addfile(info, io.BytesIO(readme))
            for name, blob in cifar_members(cifar_arrays).items():
                if name in drop:
                    continue
                info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
                info.size = len(blob)
                archive.addfile(info, io.BytesIO(blob))
        return path

    return write


AG_TRAIN = [
    ("3", "Wall St. Bears Claw Back", "Short-sellers, Wall Street's dwindling band, are back."),
    ("1", "Iraq halts oil exports", "Authorities have halted oil exports from the main pipeline."),
    ("2", "Phelps wins gold", "Michael Phelps wins his first gold medal in Athens."),
    ("4", "New chip from Intel", "Intel unveils a new chip; the chip is fast."),
    ("2", "Gold for the team", "The team wins gold again, the crowd cheers."),
]
AG_TEST = [
    ("4", "Chip news", "A faster chip from a new startup."),
    ("1", "Oil prices", "Oil prices rise in Iraq and elsewhere."),
]


@pytest.fixture
def write_ag_news() -> Callable[[Path], Path]:
    """Write ``ag_news_csv/train.csv`` and ``test.csv`` (quoted, no header); return the folder."""
    import csv

    def write(root: Path) -> Path:
        folder = root / "ag_news_csv"
        folder.mkdir(parents=True)
        for name, rows in (("train.csv", AG_TRAIN), ("test.csv", AG_TEST)):
            with (folder / name).open("w", newline="", encoding="utf-8") as stream:
                csv.writer(stream, quoting=csv.QUOTE_ALL).writerows(rows)
        return folder

    return write


@pytest.fixture
def ag_rows() -> dict[str, list[tuple[str, str, str]]]:
    """The rows ``write_ag_news`` writes, per split."""
    return {"train": AG_TRAIN, "test": AG_TEST}


@pytest.fixture
def idx_encoder() -> Callable[..., bytes]:
    """The IDX encoder used by the fixtures: ``idx_encoder(array, gz=True) -> bytes``."""
    return idx_bytes
