"""Readers for on-disk dataset formats: IDX (gzipped or not), ``.npz``, CIFAR-10 pickle batches.

Each reader checks what it reads and raises ``DataFormatError`` naming the file (and the archive
member) when the content is not what the format promises. Readers return raw arrays;
``to_images`` and ``to_labels`` turn them into the ``Dataset`` conventions (float32 NCHW in
[0, 1], int64 labels).
"""

from __future__ import annotations

import gzip
import io
import math
import pickle
import struct
import tarfile
import zipfile
import zlib
from pathlib import Path
from typing import IO, Any

import numpy as np

from fedunlearn.errors import DataFormatError

__all__ = [
    "CIFAR10_MEMBERS",
    "read_cifar_archive",
    "read_cifar_folder",
    "read_idx",
    "read_npz",
    "to_images",
    "to_labels",
]

# IDX type codes (LeCun's format description); all multi-byte values are big-endian.
_IDX_DTYPES: dict[int, str] = {
    0x08: "u1",
    0x09: "i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}
_GZIP_MAGIC = b"\x1f\x8b"

#: Split name -> pickle batch file names of the CIFAR-10 python distribution.
CIFAR10_MEMBERS: dict[str, tuple[str, ...]] = {
    "train": tuple(f"data_batch_{i}" for i in range(1, 6)),
    "test": ("test_batch",),
}
_CIFAR_FOLDER = "cifar-10-batches-py"
_CIFAR_ROW = 3 * 32 * 32


def read_idx(path: Path, *, ndim: int) -> np.ndarray:
    """Read an IDX file (``.gz`` or raw) and return its array in native byte order.

    Args:
        path: The file; gzip compression is detected from the content, not the name.
        ndim: Number of dimensions the file must have (3 for images, 1 for labels).

    Returns:
        The array with the shape stored in the header.

    Raises:
        DataFormatError: Bad magic number, wrong number of dimensions, damaged gzip stream,
            or a data section shorter or longer than the header announces.
    """
    raw = _read_bytes(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DataFormatError(
            f"{path}: not an IDX file (magic number 0x{raw[:4].hex() or 'empty'}; expected "
            "0x0000 followed by a type code 08/09/0B/0C/0D/0E and the number of dimensions)"
        )
    if raw[3] != ndim:
        raise DataFormatError(f"{path}: IDX file has {raw[3]} dimensions; expected {ndim}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataFormatError(f"{path}: truncated IDX header ({len(raw)} bytes)")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = math.prod(dims) * dtype.itemsize
    got = len(raw) - header
    if got != expected:
        what = "truncated" if got < expected else "has trailing bytes"
        raise DataFormatError(
            f"{path}: IDX file {what}: header says shape {dims} ({expected} data bytes), "
            f"file holds {got}; delete it and fetch it again"
        )
    array = np.frombuffer(raw, dtype=dtype, count=math.prod(dims), offset=header)
    return array.reshape(dims).astype(dtype.newbyteorder("="), copy=True)


def read_npz(path: Path, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Read the arrays ``keys`` from an ``.npz`` file (pickled objects are refused).

    Raises:
        DataFormatError: The file is not a readable ``.npz`` or lacks one of ``keys``.
    """
    try:
        with np.load(path, allow_pickle=False) as archive:
            files = list(archive.files)
            arrays = {key: archive[key] for key in keys if key in files}
    except (OSError, ValueError, EOFError, zlib.error, zipfile.BadZipFile) as exc:
        raise DataFormatError(f"{path}: not a readable .npz file ({exc})") from exc
    missing = [key for key in keys if key not in arrays]
    if missing:
        raise DataFormatError(
            f"{path}: missing array(s) {', '.join(missing)}; it has "
            f"{', '.join(files) or 'none'}; expected {', '.join(keys)}"
        )
    return arrays


def read_cifar_folder(folder: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Read the CIFAR-10 python batches from an extracted ``cifar-10-batches-py`` folder.

    Returns:
        ``{"train": (x, y), "test": (x, y)}`` with ``x`` uint8 ``(N, 3, 32, 32)``, ``y`` int64.

    Raises:
        DataFormatError: A batch file is missing or not a CIFAR-10 batch.
    """
    batches: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for member in (*CIFAR10_MEMBERS["train"], *CIFAR10_MEMBERS["test"]):
        path = folder / member
        if not path.is_file():
            raise DataFormatError(f"{folder}: missing CIFAR-10 batch file '{member}'")
        with path.open("rb") as stream:
            batches[member] = _parse_cifar_batch(stream, str(path))
    return _join_cifar(batches)


def read_cifar_archive(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Read CIFAR-10 batches from ``cifar-10-python.tar.gz`` in one pass, extracting nothing.

    Returns:
        Same as ``read_cifar_folder``.

    Raises:
        DataFormatError: The archive is damaged or lacks one of the six batch files.
    """
    wanted = {*CIFAR10_MEMBERS["train"], *CIFAR10_MEMBERS["test"]}
    batches: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    try:
        with tarfile.open(path, mode="r|*") as archive:  # stream: one sequential pass
            for info in archive:
                folder, _, base = info.name.rpartition("/")
                if info.isfile() and base in wanted and folder.endswith(_CIFAR_FOLDER):
                    stream = archive.extractfile(info)
                    if stream is not None:
                        batches[base] = _parse_cifar_batch(stream, f"{path}:{info.name}")
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise DataFormatError(
            f"{path}: damaged archive ({exc}); delete it and fetch it again"
        ) from exc
    missing = sorted(wanted - batches.keys())
    if missing:
        raise DataFormatError(
            f"{path}: archive lacks {_CIFAR_FOLDER}/{', '.join(missing)}; "
            "expected the CIFAR-10 python version (cifar-10-python.tar.gz)"
        )
    return _join_cifar(batches)


def to_images(x: np.ndarray, shape: tuple[int, int, int], where: str) -> np.ndarray:
    """Convert images to float32 ``(N, C, H, W)`` in [0, 1].

    Accepts ``(N, H, W)`` when ``C == 1``, ``(N, C, H, W)`` and ``(N, H, W, C)``; uint8 values
    are divided by 255, float values must already lie in [0, 1].

    Args:
        x: The raw image array.
        shape: ``(C, H, W)`` of one image.
        where: File (and array) name used in error messages.

    Raises:
        DataFormatError: Wrong shape, dtype or value range.
    """
    c, h, w = shape
    if x.ndim == 3 and c == 1 and x.shape[1:] == (h, w):
        x = x[:, None]
    elif x.ndim == 4 and x.shape[1:] == (h, w, c) and x.shape[1:] != shape:
        x = x.transpose(0, 3, 1, 2)
    elif not (x.ndim == 4 and x.shape[1:] == shape):
        accepted = f"(N, {c}, {h}, {w}) or (N, {h}, {w}, {c})" + (
            f" or (N, {h}, {w})" if c == 1 else ""
        )
        raise DataFormatError(f"{where}: images have shape {x.shape}; expected {accepted}")
    if x.dtype == np.uint8:
        out = x.astype(np.float32)
        out /= 255.0
    elif np.issubdtype(x.dtype, np.floating):
        out = x.astype(np.float32)
        if out.size and (out.min() < 0.0 or out.max() > 1.0 or not np.isfinite(out).all()):
            raise DataFormatError(f"{where}: float images must lie in [0, 1]")
    else:
        raise DataFormatError(f"{where}: images have dtype {x.dtype}; expected uint8 or float")
    return np.ascontiguousarray(out)


def to_labels(y: np.ndarray, num_classes: int, where: str) -> np.ndarray:
    """Convert labels to a flat int64 array with values in ``0..num_classes-1``.

    Raises:
        DataFormatError: Non-integer dtype, not 1-D (``(N, 1)`` is flattened) or out of range.
    """
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise DataFormatError(
            f"{where}: labels have shape {y.shape} and dtype {y.dtype}; expected integer (N,)"
        )
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise DataFormatError(
            f"{where}: labels range over {int(y.min())}..{int(y.max())}; "
            f"expected 0..{num_classes - 1}"
        )
    return y.astype(np.int64)


def _read_bytes(path: Path) -> bytes:
    raw = path.read_bytes()
    if raw[:2] != _GZIP_MAGIC:
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataFormatError(
            f"{path}: damaged gzip stream ({exc}); delete it and fetch it again"
        ) from exc


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickler that builds only numpy arrays and builtins, never arbitrary objects."""

    _ALLOWED = frozenset(
        {
            ("_codecs", "encode"),
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy.core.numeric", "_frombuffer"),
            ("numpy._core.numeric", "_frombuffer"),
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load global {module}.{name}")


def _parse_cifar_batch(stream: IO[bytes], where: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        # latin1 decodes Python 2 pickles (the official files) the way torchvision does.
        batch = _NumpyOnlyUnpickler(io.BufferedReader(stream), encoding="latin1").load()  # type: ignore[arg-type, type-var]
    except Exception as exc:  # pickle raises many types on garbage input
        raise DataFormatError(
            f"{where}: not a CIFAR-10 pickle batch ({type(exc).__name__}: {exc})"
        ) from exc
    if not isinstance(batch, dict):
        raise DataFormatError(
            f"{where}: not a CIFAR-10 pickle batch (holds a {type(batch).__name__})"
        )
    data = batch.get("data", batch.get(b"data"))
    labels = batch.get("labels", batch.get(b"labels"))
    if (
        not isinstance(data, np.ndarray)
        or data.dtype != np.uint8
        or data.ndim != 2
        or data.shape[1] != _CIFAR_ROW
    ):
        raise DataFormatError(f"{where}: 'data' must be a uint8 array of shape (N, {_CIFAR_ROW})")
    try:
        y = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise DataFormatError(f"{where}: 'labels' is not a list of integers") from exc
    if y.shape != (data.shape[0],):
        raise DataFormatError(f"{where}: {data.shape[0]} images but labels of shape {y.shape}")
    # Rows store the red, green, blue 32x32 planes one after the other.
    return data.reshape(-1, 3, 32, 32), y


def _join_cifar(
    batches: dict[str, tuple[np.ndarray, np.ndarray]],
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    joined = {}
    for split, members in CIFAR10_MEMBERS.items():
        joined[split] = (
            np.concatenate([batches[m][0] for m in members]),
            np.concatenate([batches[m][1] for m in members]),
        )
    return joined
