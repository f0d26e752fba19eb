"""Datasets by name: the ``Dataset`` value, the ``DATASETS`` registry and ``load_dataset``.

Owns where files are looked for (``data_dir`` argument, else ``$FEDUNLEARN_DATA``, else
``~/.cache/fedunlearn``; nothing else), which layouts each dataset accepts, and the
conventions every loader returns: images float32 ``(N, C, H, W)`` in [0, 1], text int64 token
ids ``(N, L)`` (0 = ``<pad>``, 1 = ``<unk>``), tabular float32 ``(N, F)``, labels int64.
File formats live in ``formats``, downloads in ``download``, tokenization in ``text``.
"""

from __future__ import annotations

import gzip
import importlib.util
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from fedunlearn.data import formats, tabular, text
from fedunlearn.data.download import DATA_DIR_ENV, DOWNLOAD_ENV, obtain
from fedunlearn.errors import ConfigError, DataFormatError, UnknownNameError

__all__ = [
    "DATASETS",
    "DATA_DIR_ENV",
    "DOWNLOAD_ENV",
    "Dataset",
    "DatasetLoader",
    "load_dataset",
    "resolve_data_dir",
]

KINDS = ("image", "text", "tabular")
_OFF_WORDS = ("0", "false", "no", "off")
_X_DTYPES = {"image": np.float32, "text": np.int64, "tabular": np.float32}


@dataclass(frozen=True, eq=False, repr=False)
class Dataset:
    """A train/test split with the conventions of this package (checked on construction).

    Attributes:
        name: Registry name, e.g. ``"mnist"``.
        x_train: Images float32 ``(N, C, H, W)`` in [0, 1]; text int64 ``(N, L)`` token ids
            (0 = ``<pad>``, 1 = ``<unk>``); tabular float32 ``(N, F)``.
        y_train: int64 ``(N,)`` labels in ``0..num_classes-1``.
        x_test: Same layout as ``x_train``.
        y_test: Same layout as ``y_train``.
        num_classes: Number of classes.
        input_shape: Shape of one example, e.g. ``(1, 28, 28)``.
        kind: ``"image"``, ``"text"`` or ``"tabular"``.
        meta: Extra facts: ``source`` (file or generator), ``classes`` (names); for text
            ``vocab`` (token list, id = index) and ``vocab_size`` (``len(vocab)``).
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    input_shape: tuple[int, ...]
    kind: str
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_shape", tuple(int(d) for d in self.input_shape))
        if self.kind not in KINDS:
            raise DataFormatError(
                f"dataset '{self.name}': kind must be one of {KINDS}; got {self.kind!r}"
            )
        for split in ("train", "test"):
            x, y = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
            where = f"dataset '{self.name}' ({split})"
            if x.dtype != _X_DTYPES[self.kind] or x.shape[1:] != self.input_shape:
                raise DataFormatError(
                    f"{where}: x has dtype {x.dtype} and shape {x.shape}; a {self.kind} dataset "
                    f"needs {np.dtype(_X_DTYPES[self.kind])} and shape "
                    f"(N, *{self.input_shape})"
                )
            if y.dtype != np.int64 or y.shape != (x.shape[0],):
                raise DataFormatError(
                    f"{where}: y must be int64 of shape ({x.shape[0]},); got {y.dtype} {y.shape}"
                )
            if y.size and (y.min() < 0 or y.max() >= self.num_classes):
                raise DataFormatError(f"{where}: labels must lie in 0..{self.num_classes - 1}")

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, kind={self.kind!r}, train={len(self.y_train)}, "
            f"test={len(self.y_test)}, input_shape={self.input_shape}, "
            f"num_classes={self.num_classes})"
        )


#: A loader takes the resolved data dir and download flag plus its own keyword options.
DatasetLoader = Callable[..., Dataset]


def resolve_data_dir(data_dir: str | Path | None = None) -> Path:
    """Return ``data_dir``, else ``$FEDUNLEARN_DATA``, else ``~/.cache/fedunlearn``."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    env = os.environ.get(DATA_DIR_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fedunlearn"


def load_dataset(
    name: str,
    *,
    data_dir: str | Path | None = None,
    download: bool | None = None,
    **options: Any,
) -> Dataset:
    """Load a dataset by name from the data directory, downloading missing files if allowed.

    Args:
        name: A key of ``DATASETS`` (``digits``, ``mnist``, ``fashion-mnist``, ``cifar10``,
            ``ag_news``, ``synthetic``).
        data_dir: Where dataset files live; default ``$FEDUNLEARN_DATA``, else
            ``~/.cache/fedunlearn``.
        download: Fetch missing files from the public mirrors. ``None`` means yes unless
            ``$FEDUNLEARN_DOWNLOAD`` is ``0``/``false``/``no``/``off``.
        **options: Loader options, e.g. ``seed`` and ``test_fraction`` for ``digits``,
            ``vocab_size`` and ``max_len`` for ``ag_news``.

    Returns:
        The dataset.

    Raises:
        UnknownNameError: ``name`` is not registered.
        ConfigError: An option is unknown to the loader or out of range.
        DataUnavailableError: Files are missing and could not be downloaded; the message says
            which files to put in which directory.
        DataFormatError: A file exists but is damaged or in the wrong format.
    """
    loader = DATASETS.get(name)
    if loader is None:
        raise UnknownNameError(
            f"unknown dataset {name!r}; available: {', '.join(sorted(DATASETS))}"
        )
    params = inspect.signature(loader).parameters
    allowed = sorted(p for p in params if p not in ("data_dir", "download"))
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = sorted(set(options) - set(allowed))
    if unknown and not takes_any:
        raise ConfigError(
            f"dataset {name!r} has no option {', '.join(map(repr, unknown))}; "
            f"its options are: {', '.join(allowed) or 'none'}"
        )
    if download is None:
        download = os.environ.get(DOWNLOAD_ENV, "1").strip().lower() not in _OFF_WORDS
    return loader(data_dir=resolve_data_dir(data_dir), download=download, **options)


# --- embedded datasets -------------------------------------------------------------------


def load_digits(
    *, data_dir: Path, download: bool, test_fraction: float = 0.25, seed: int = 0
) -> Dataset:
    """Scikit-learn's bundled 8x8 digits (1797 images, values 0..16 scaled by 1/16).

    Args:
        data_dir: Unused (the data ships with scikit-learn).
        download: Unused.
        test_fraction: Share of each class put in the test split.
        seed: Seed of the stratified split.
    """
    x, y = _sklearn_digits()
    x = (np.asarray(x, dtype=np.float32) / 16.0).reshape(-1, 1, 8, 8)
    meta = {"source": "sklearn.datasets.load_digits", "classes": [str(d) for d in range(10)]}
    return _split(
        "digits", x, np.asarray(y, dtype=np.int64), 10, "image", meta, test_fraction, seed
    )


def _digits_csv() -> Path | None:
    """Return scikit-learn's ``datasets/data/digits.csv.gz``, found without importing it."""
    spec = importlib.util.find_spec("sklearn")  # a top-level package: found, not run
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(root) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return path
    return None


def _sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    """Return ``sklearn.datasets.load_digits(return_X_y=True)``, without importing scikit-learn.

    scikit-learn's loader reads ``datasets/data/digits.csv.gz`` with ``np.loadtxt``; importing
    it costs a process about 2 s of CPU (scipy and scikit-learn's base), paid by every CLI and
    Flower process that loads digits. The file is read the same way, so the arrays are the
    same, bit for bit; where the file is not found, scikit-learn's loader is used.
    """
    path = _digits_csv()
    if path is not None:
        with gzip.open(path, mode="rt", encoding="utf-8") as fh:
            data = np.loadtxt(fh, delimiter=",")
        return data[:, :-1], data[:, -1].astype(int, copy=False)
    from sklearn.datasets import load_digits as sklearn_digits  # lazy: sklearn is slow to import

    x, y = sklearn_digits(return_X_y=True)
    return x, y


def load_synthetic(
    *,
    data_dir: Path,
    download: bool,
    num_samples: int = 2000,
    num_features: int = 20,
    num_classes: int = 4,
    separation: float = 2.0,
    test_fraction: float = 0.25,
    seed: int = 0,
) -> Dataset:
    """Gaussian blobs: balanced classes, unit-variance noise around one mean per class.

    Class means point in random directions at distance ``separation`` from the origin, so
    two means are about ``separation * sqrt(2)`` apart when ``num_features`` is large.

    Args:
        data_dir: Unused.
        download: Unused.
        num_samples: Train plus test examples.
        num_features: Dimension F of one example.
        num_classes: Number of blobs.
        separation: Norm of every class mean (in noise standard deviations).
        test_fraction: Share of each class put in the test split.
        seed: Seed of the means, the noise and the split.
    """
    for option, value, low in (("num_samples", num_samples, 2), ("num_features", num_features, 1)):
        if value < low:
            raise ConfigError(f"synthetic: {option} must be >= {low}; got {value}")
    if not 2 <= num_classes <= num_samples:
        raise ConfigError(f"synthetic: num_classes must lie in 2..num_samples; got {num_classes}")
    if not separation >= 0:
        raise ConfigError(f"synthetic: separation must be >= 0; got {separation}")
    rng = np.random.default_rng([_check_seed(seed), 1])  # a stream apart from the split's
    means = rng.normal(size=(num_classes, num_features))
    means *= separation / np.linalg.norm(means, axis=1, keepdims=True)
    y = rng.permutation(np.arange(num_samples) % num_classes).astype(np.int64)
    x = (means[y] + rng.normal(size=(num_samples, num_features))).astype(np.float32)
    meta = {"source": "synthetic", "classes": [str(c) for c in range(num_classes)]}
    return _split("synthetic", x, y, num_classes, "tabular", meta, test_fraction, seed)


def _split(
    name: str,
    x: np.ndarray,
    y: np.ndarray,
    num_classes: int,
    kind: str,
    meta: dict[str, Any],
    test_fraction: float,
    seed: int,
) -> Dataset:
    """Build a Dataset from one pool with a stratified split (per class, round(n_c * fraction))."""
    if not 0.0 < test_fraction < 1.0:
        raise ConfigError(f"{name}: test_fraction must lie in (0, 1); got {test_fraction}")
    rng = np.random.default_rng(_check_seed(seed))
    is_test = np.zeros(len(y), dtype=bool)
    for label in range(num_classes):
        members = rng.permutation(np.flatnonzero(y == label))
        is_test[members[: round(len(members) * test_fraction)]] = True
    return Dataset(
        name, x[~is_test], y[~is_test], x[is_test], y[is_test], num_classes, x.shape[1:], kind, meta
    )


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer; got {seed!r}")
    return int(seed)


# --- file datasets -----------------------------------------------------------------------

_IDX_STEMS = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
_SPLIT_KEYS = ("x_train", "y_train", "x_test", "y_test")
# Sub-directories searched for IDX files before the data dir itself (ours, then torchvision's).
_IDX_SUBDIRS = {
    "mnist": ("mnist", "MNIST/raw"),
    "fashion-mnist": ("fashion-mnist", "FashionMNIST/raw"),
}
_CLASSES = {
    "mnist": [str(d) for d in range(10)],
    "fashion-mnist": ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat"]
    + ["Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"],
    "cifar10": ["airplane", "automobile", "bird", "cat", "deer"]
    + ["dog", "frog", "horse", "ship", "truck"],
    "ag_news": ["World", "Sports", "Business", "Sci/Tech"],
}


def _load_mnist_like(name: str, data_dir: Path, download: bool) -> Dataset:
    def find() -> Path | None:
        for npz in (data_dir / f"{name}.npz", data_dir / name / f"{name}.npz"):
            if npz.is_file():
                return npz
        for folder in (*(data_dir / s for s in _IDX_SUBDIRS[name]), data_dir):
            if _idx_files(folder) is not None:
                return folder
        return None

    npz = f"{data_dir / name}.npz with uint8 arrays x_train (N, 28, 28), y_train, x_test, y_test"
    source = obtain(name, data_dir, download, find, alternative=npz)
    if source.suffix == ".npz":
        raw = formats.read_npz(source, _SPLIT_KEYS)
        where = {key: f"{source} [{key}]" for key in _SPLIT_KEYS}
    else:
        paths = _idx_files(source) or {}
        raw = {
            key: formats.read_idx(path, ndim=3 if key[0] == "x" else 1)
            for key, path in paths.items()
        }
        where = {key: str(path) for key, path in paths.items()}
    arrays = {}
    for split in ("train", "test"):
        xk, yk = f"x_{split}", f"y_{split}"
        arrays[xk] = formats.to_images(raw[xk], (1, 28, 28), where[xk])
        arrays[yk] = formats.to_labels(raw[yk], 10, where[yk])
        if len(arrays[xk]) != len(arrays[yk]):
            raise DataFormatError(
                f"{where[xk]} has {len(arrays[xk])} images but {where[yk]} {len(arrays[yk])} labels"
            )
    meta = {"source": str(source), "classes": _CLASSES[name]}
    return Dataset(name, **arrays, num_classes=10, input_shape=(1, 28, 28), kind="image", meta=meta)


def _idx_files(folder: Path) -> dict[str, Path] | None:
    """Return the four IDX files in ``folder`` (``.gz`` preferred), or None if one is missing."""
    found = {}
    for key, stem in _IDX_STEMS.items():
        path = next((p for p in (folder / f"{stem}.gz", folder / stem) if p.is_file()), None)
        if path is None:
            return None
        found[key] = path
    return found


def load_mnist(*, data_dir: Path, download: bool) -> Dataset:
    """MNIST from ``mnist.npz`` or the four IDX files (in ``mnist/``, ``MNIST/raw/`` or the dir)."""
    return _load_mnist_like("mnist", data_dir, download)


def load_fashion_mnist(*, data_dir: Path, download: bool) -> Dataset:
    """Fashion-MNIST from ``fashion-mnist.npz`` or the four IDX files (``fashion-mnist/`` first).

    The data dir itself is searched last, so keep MNIST and Fashion-MNIST IDX files in their
    sub-directories when you have both (the file names are the same).
    """
    return _load_mnist_like("fashion-mnist", data_dir, download)


def load_cifar10(*, data_dir: Path, download: bool) -> Dataset:
    """CIFAR-10 from ``cifar10.npz``, ``cifar-10-batches-py/`` or ``cifar-10-python.tar.gz``.

    Each is looked for in the data dir, then in its ``cifar10/`` sub-directory. The npz holds
    uint8 ``x_train``/``x_test`` as ``(N, 32, 32, 3)`` or ``(N, 3, 32, 32)``.
    """

    def find() -> Path | None:
        for folder in (data_dir, data_dir / "cifar10"):
            for candidate in ("cifar10.npz", "cifar-10-batches-py", "cifar-10-python.tar.gz"):
                if (folder / candidate).exists():
                    return folder / candidate
        return None

    alternative = (
        f"{data_dir / 'cifar-10-batches-py'}{os.sep} with data_batch_1..5 and test_batch, or "
        f"{data_dir / 'cifar10.npz'} with uint8 arrays x_train (N, 32, 32, 3), y_train, "
        "x_test, y_test"
    )
    source = obtain("cifar10", data_dir, download, find, alternative=alternative)
    if source.suffix == ".npz":
        raw = formats.read_npz(source, _SPLIT_KEYS)
        splits = {s: (raw[f"x_{s}"], raw[f"y_{s}"]) for s in ("train", "test")}
    elif source.is_dir():
        splits = formats.read_cifar_folder(source)
    else:
        splits = formats.read_cifar_archive(source)
    arrays = {}
    for split, (x, y) in splits.items():
        arrays[f"x_{split}"] = formats.to_images(x, (3, 32, 32), f"{source} [x_{split}]")
        arrays[f"y_{split}"] = formats.to_labels(y, 10, f"{source} [y_{split}]")
    meta = {"source": str(source), "classes": _CLASSES["cifar10"]}
    return Dataset(
        "cifar10", **arrays, num_classes=10, input_shape=(3, 32, 32), kind="image", meta=meta
    )


def load_ag_news(
    *, data_dir: Path, download: bool, vocab_size: int = 25000, max_len: int = 64
) -> Dataset:
    """AG News from ``ag_news_csv/train.csv`` and ``test.csv`` (also under ``ag_news/``).

    Args:
        data_dir: The data directory.
        download: Fetch the CSV files if missing.
        vocab_size: Number of most frequent training tokens kept (``<pad>``, ``<unk>`` extra).
        max_len: Token ids per text (truncated or padded with 0).
    """
    if vocab_size < 1 or max_len < 1:
        raise ConfigError(
            f"ag_news: vocab_size and max_len must be >= 1; got {vocab_size}, {max_len}"
        )

    def find() -> Path | None:
        for folder in (
            data_dir / "ag_news_csv",
            data_dir / "ag_news" / "ag_news_csv",
            data_dir / "ag_news",
        ):
            if (folder / "train.csv").is_file() and (folder / "test.csv").is_file():
                return folder
        return None

    folder = obtain("ag_news", data_dir, download, find)
    num_classes = len(_CLASSES["ag_news"])
    texts_train, y_train = text.read_labelled_csv(folder / "train.csv", num_classes)
    texts_test, y_test = text.read_labelled_csv(folder / "test.csv", num_classes)
    tokens_train = [text.tokenize(t) for t in texts_train]
    vocab = text.build_vocab(tokens_train, vocab_size)
    x_train = text.encode(tokens_train, vocab, max_len)
    x_test = text.encode([text.tokenize(t) for t in texts_test], vocab, max_len)
    meta = {
        "source": str(folder),
        "classes": _CLASSES["ag_news"],
        "vocab": vocab,
        "vocab_size": len(vocab),
    }
    return Dataset(
        "ag_news", x_train, y_train, x_test, y_test, num_classes, (max_len,), "text", meta
    )


def _tabular(name: str, arrays: dict[str, Any]) -> Dataset:
    num_classes = arrays.pop("num_classes")
    meta = {"source": arrays.pop("source"), "classes": [str(c) for c in range(num_classes)]}
    shape = arrays["x_train"].shape[1:]
    return Dataset(
        name, **arrays, num_classes=num_classes, input_shape=shape, kind="tabular", meta=meta
    )


def _uci_file(
    name: str,
    read: Callable[..., dict[str, Any]],
    *,
    data_dir: Path,
    download: bool,
    max_samples: int | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> Dataset:
    """A UCI table read by ``read`` (``tabular.load_covtype``/``load_higgs``); never downloaded.

    Covertype comes from ``covtype.data.gz``, HIGGS from ``HIGGS.csv.gz`` (its first
    ``max_samples`` rows).
    """
    arrays = read(
        data_dir=data_dir, max_samples=max_samples, test_fraction=test_fraction, seed=seed
    )
    return _tabular(name, arrays)


def _tabular_like(
    name: str,
    make: Callable[..., dict[str, Any]],
    *,
    data_dir: Path,
    download: bool,
    num_samples: int = 20000,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> Dataset:
    """A synthetic stand-in made by ``make``.

    Covtype's has 54 features and 7 imbalanced classes; HIGGS's 28 features, binary labels,
    weakly separable.
    """
    arrays = make(num_samples=num_samples, test_fraction=test_fraction, seed=seed)
    return _tabular(name, arrays)


#: Dataset name -> loader ``(*, data_dir, download, **options) -> Dataset``.
DATASETS: dict[str, DatasetLoader] = {
    "digits": load_digits,
    "mnist": load_mnist,
    "fashion-mnist": load_fashion_mnist,
    "cifar10": load_cifar10,
    "ag_news": load_ag_news,
    "synthetic": load_synthetic,
    "covtype": partial(_uci_file, "covtype", tabular.load_covtype),
    "higgs": partial(_uci_file, "higgs", tabular.load_higgs),
    "covtype_like": partial(_tabular_like, "covtype_like", tabular.load_covtype_like),
    "higgs_like": partial(_tabular_like, "higgs_like", tabular.load_higgs_like),
}
