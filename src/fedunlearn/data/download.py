"""Fetching dataset files from public mirrors, with checksums, atomic writes and fast failure.

``RESOURCES`` says, per dataset, which files exist where and what they hash to (the checksums
torchvision and torchtext use). ``fetch`` downloads the missing ones with ``urllib.request``
(short timeout, a rich progress bar on a terminal) into a temporary file next to the target,
verifies the checksum and renames it into place. An offline machine gets a
``DataUnavailableError`` after the first file's mirrors all fail, without trying the rest.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fedunlearn.errors import DataFormatError, DataUnavailableError

if TYPE_CHECKING:
    from rich.progress import Progress

__all__ = [
    "DATA_DIR_ENV",
    "DOWNLOAD_ENV",
    "RESOURCES",
    "RemoteFile",
    "Resource",
    "fetch",
    "fetch_file",
    "obtain",
]

DATA_DIR_ENV = "FEDUNLEARN_DATA"
DOWNLOAD_ENV = "FEDUNLEARN_DOWNLOAD"  # "0", "false", "no" or "off" disable downloads
#: Seconds to wait for a connection or for the next block of data.
TIMEOUT_SECONDS = 10.0
_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class RemoteFile:
    """One downloadable file: its name on disk, checksum and the mirrors serving it.

    Attributes:
        name: File name on disk and on every mirror (mirror URL = base + name).
        checksum: ``"md5:<hex>"`` or ``"sha256:<hex>"`` of the exact file.
        mirrors: Base URLs ending in ``/``, tried in order.
    """

    name: str
    checksum: str
    mirrors: tuple[str, ...]

    @property
    def urls(self) -> tuple[str, ...]:
        """Full URLs, one per mirror."""
        return tuple(base + self.name for base in self.mirrors)


@dataclass(frozen=True)
class Resource:
    """The files of one dataset and the sub-directory of the data dir they go to ('': the dir)."""

    subdir: str
    files: tuple[RemoteFile, ...]


_MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)
_FASHION_MIRRORS = (
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
)
_IDX_FILES: tuple[str, ...] = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")
_IDX_FILES += ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


def _idx_resource(subdir: str, md5s: tuple[str, ...], mirrors: tuple[str, ...]) -> Resource:
    files = tuple(RemoteFile(n, f"md5:{h}", mirrors) for n, h in zip(_IDX_FILES, md5s, strict=True))
    return Resource(subdir, files)


#: Dataset name -> where its files come from (checksums as published by torchvision/torchtext).
RESOURCES: dict[str, Resource] = {
    "mnist": _idx_resource(
        "mnist",
        (
            "f68b3c2dcbeaaa9fbdd348bbdeb94873",
            "d53e105ee54ea40749a09fcbcd1e9432",
            "9fb629c4189551a2d022fa330f9573f3",
            "ec29112dd5afa0611ce80d1b7f02629c",
        ),
        _MNIST_MIRRORS,
    ),
    "fashion-mnist": _idx_resource(
        "fashion-mnist",
        (
            "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
            "25c81989df183df01b3e8a0aad5dffbe",
            "bef4ecab320f06d8554ea6380940ec79",
            "bb300cfdad3c16e7a12a480ee83cd310",
        ),
        _FASHION_MIRRORS,
    ),
    "cifar10": Resource(
        "",
        (
            RemoteFile(
                "cifar-10-python.tar.gz",
                "md5:c58f30108f718f92721af3b95e74349a",
                ("https://www.cs.toronto.edu/~kriz/",),
            ),
        ),
    ),
    "ag_news": Resource(
        "ag_news_csv",
        tuple(
            RemoteFile(
                name,
                f"md5:{md5}",
                (
                    "https://raw.githubusercontent.com/mhjabreel/CharCnn_Keras/master/data/ag_news_csv/",
                ),
            )
            for name, md5 in (
                ("train.csv", "b1a00f826fdfbd249f79597b59e1dc12"),
                ("test.csv", "d52ea96a97a2d943681189a97654912d"),
            )
        ),
    ),
}


def obtain(
    name: str,
    data_dir: Path,
    download: bool,
    find: Callable[[], Path | None],
    *,
    alternative: str | None = None,
) -> Path:
    """Return what ``find()`` locates, after downloading ``RESOURCES[name]`` if it finds nothing.

    Args:
        name: Dataset name, a key of ``RESOURCES``.
        data_dir: The data directory.
        download: Whether fetching is allowed.
        find: Looks for usable files in ``data_dir``; returns a path or None.
        alternative: Another accepted layout, named in the error message.

    Returns:
        The path returned by ``find``.

    Raises:
        DataUnavailableError: Nothing found and nothing downloaded. The message names the files,
            their directory and mirror, ``alternative``, and how to choose another data dir.
        DataFormatError: A downloaded file failed its checksum.
    """
    found = find()
    if found is not None:
        return found
    if not download:
        reason = f"downloading is off (download=False or {DOWNLOAD_ENV}=0)"
    else:
        try:
            fetch(RESOURCES[name], data_dir)
        except DataUnavailableError as exc:
            reason = f"the download failed: {exc}"
        else:
            found = find()
            if found is not None:
                return found
            reason = "the downloaded files were not found where expected"
    resource = RESOURCES[name]
    target = data_dir / resource.subdir if resource.subdir else data_dir
    env = os.environ.get(DATA_DIR_ENV)
    raise DataUnavailableError(
        f"dataset {name!r} was not found in {data_dir} and {reason}.\n"
        f"Put {', '.join(f.name for f in resource.files)} into {target}{os.sep} "
        f"(from {resource.files[0].mirrors[0]})"
        + (f", or provide {alternative}.\n" if alternative else ".\n")
        + "To use another directory pass data_dir=... (CLI: --data-dir) or set the environment "
        f"variable {DATA_DIR_ENV} (currently {'unset' if env is None else repr(env)})."
    )


def fetch(resource: Resource, data_dir: Path, *, timeout: float = TIMEOUT_SECONDS) -> Path:
    """Download the files of ``resource`` missing from ``data_dir / resource.subdir``.

    Args:
        resource: What to download (an entry of ``RESOURCES``).
        data_dir: The data directory; created if needed.
        timeout: Seconds to wait for a connection or the next block of data, per mirror.

    Returns:
        The directory holding the files.

    Raises:
        DataUnavailableError: A file could not be fetched from any of its mirrors (offline,
            HTTP error, unwritable directory); files fetched before it are kept.
        DataFormatError: A fetched file failed its checksum (the file was deleted).
    """
    target = data_dir / resource.subdir if resource.subdir else data_dir
    for remote in resource.files:
        if not (target / remote.name).is_file():
            fetch_file(remote, target / remote.name, timeout=timeout)
    return target


def fetch_file(remote: RemoteFile, dest: Path, *, timeout: float = TIMEOUT_SECONDS) -> Path:
    """Download ``remote`` to ``dest`` atomically, trying each mirror until one answers.

    The bytes go to a temporary file in ``dest``'s directory, are hashed on the way, and the
    file is renamed to ``dest`` only if the checksum matches.

    Args:
        remote: The file, its checksum and its mirrors.
        dest: Final path of the file.
        timeout: Seconds to wait for a connection or the next block of data, per mirror.

    Returns:
        ``dest``.

    Raises:
        DataUnavailableError: No mirror delivered the file, or ``dest``'s directory is unwritable.
        DataFormatError: The delivered file does not match ``remote.checksum``.
    """
    algorithm, _, expected = remote.checksum.partition(":")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataUnavailableError(f"cannot create {dest.parent} ({exc})") from exc
    failures = []
    for url in remote.urls:
        try:
            tmp, digest = _download_to_temp(url, dest, algorithm, timeout)
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            # a plain URLError says its reason; HTTPError's str has the code
            failures.append(f"{url}: {exc.reason if type(exc) is urllib.error.URLError else exc}")
            continue
        if digest != expected:
            tmp.unlink(missing_ok=True)
            raise DataFormatError(
                f"{url} delivered a file whose {algorithm} is {digest}, expected {expected}; "
                f"it was deleted. Download {remote.name} by hand into {dest.parent} and retry."
            )
        os.replace(tmp, dest)
        return dest
    raise DataUnavailableError(f"could not download {remote.name} ({'; '.join(failures)})")


def _download_to_temp(url: str, dest: Path, algorithm: str, timeout: float) -> tuple[Path, str]:
    """Stream ``url`` into a temporary file beside ``dest``; return it and its hex digest."""
    hasher = hashlib.new(algorithm)
    request = urllib.request.Request(url, headers={"User-Agent": "fedunlearn"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        total = int(response.headers.get("Content-Length") or 0) or None
        fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
        tmp = Path(name)
        try:
            with os.fdopen(fd, "wb") as out, _progress() as progress:
                task = progress.add_task(dest.name, total=total)
                while chunk := response.read(_CHUNK_BYTES):
                    hasher.update(chunk)
                    out.write(chunk)
                    progress.advance(task, len(chunk))
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return tmp, hasher.hexdigest()


def _progress() -> Progress:
    from rich.console import Console  # lazy: only a download needs rich
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    console = Console(stderr=True)
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
