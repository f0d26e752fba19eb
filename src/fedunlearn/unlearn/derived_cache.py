"""What a method derives from the run alone, kept in the run directory for the next request.

Crab's and FedADP's selection on a run recorded with ``history.policy: all`` (which rounds and
clients their Stage I would have kept while training) depends on the stored history and the
selection options, not on the request. The first request derives it: at 1,000 clients x 200
rounds that is about 2 s of a 7 s Crab request (a forward pass of every global model on the
reference set R, every kept round's updates read: docs/performance.md, "1,000 clients").
Later requests on the same history read it from here.

Validity. A file is named by the SHA-256 of what it holds, the options it was derived with, the
run's fingerprint, the head of the run's committed history chain (``history.store.chain``)
and the package's version: an ``apply``, a ``forget`` or a continuation adds a link, and an
upgrade may change a selector, so every earlier file goes stale without being looked at
again (``forget`` deletes the folder). A run written before the chain caches nothing.

Integrity. The document carries the SHA-256 of its body. A file that does not parse, whose
digest or key does not match, or whose content the method cannot read back is ignored and
derived again (and rewritten): a corrupt cache costs the derivation's time, never a different
result from an untouched one. Only a regular file inside the run directory is read (no link,
FIFO or device, at most ``MAX_BYTES``), and only regular files are removed. A file that cannot
be written (a full or read-only disk, a link where the folder should be) is skipped with a
warning; the request's result does not depend on it.

What the cache does not defend against: a writer who edits a selection and recomputes its
digest, and a payload damaged outside the chain that only the derivation would have read (a
request that reads the cache does not read it, so its checksum is not checked). It is a
convenience of the run directory's owner, not evidence: ``fedunlearn check-receipt`` and
``audit`` open the run with ``UnlearnSession(..., derived_cache=False)`` and derive
everything from the committed history, and ``fedunlearn verify`` checks every payload.

Lineage. A cached derivation still depends on the payloads it read: the file lists them, and
the method logs them as reads (``ReadLog``), so a result's lineage is the same whether its
selection was derived or read here. The bytes are not counted: they were not read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedunlearn.atomic import write_bytes_atomic

__all__ = ["DerivedCache"]

FORMAT = 1
MAX_BYTES = 64 * 2**20  # a 1,000-client, 200-round selection takes well under 1 MB

log = logging.getLogger(__name__)


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class DerivedCache:
    """One run history's derived results (see the module docstring).

    Args:
        folder: Where the files go (``<run>/derived``), created on the first write.
        scope: What identifies the history: the run's fingerprint and its chain head's link.
    """

    folder: Path
    scope: str

    def _path(self, what: str, options: Mapping[str, Any]) -> tuple[Path, str]:
        key = _digest({"what": what, "options": dict(options), "scope": self.scope})
        return self.folder / f"{what}-{key[:32]}.json", key

    def _usable_folder(self) -> bool:
        """The folder is a real directory (or absent), never a link: nothing outside the run."""
        return not self.folder.is_symlink() and (self.folder.is_dir() or not self.folder.exists())

    def get(self, what: str, options: Mapping[str, Any]) -> dict[str, Any] | None:
        """Return the body kept for ``what`` derived with ``options``, or None."""
        path, key = self._path(what, options)
        if not self._usable_folder():
            log.warning("ignoring the derived cache %s: not a directory of the run", self.folder)
            return None
        try:
            doc = json.loads(_read_regular(path))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            log.warning("ignoring the unreadable derived cache %s (%s)", path, err)
            return None
        body = doc.get("body") if isinstance(doc, dict) else None
        if (
            not isinstance(body, dict)
            or doc.get("format") != FORMAT
            or doc.get("key") != key
            or doc.get("sha256") != _digest(body)
        ):
            log.warning("ignoring the derived cache %s: it does not match its key or digest", path)
            return None
        return body

    def put(self, what: str, options: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
        """Keep ``body`` for ``what`` derived with ``options``; False when it could not be written.

        Other files of the same ``what`` (another history's, or other options') are removed: a
        run keeps one.
        """
        path, key = self._path(what, options)
        doc = {"format": FORMAT, "key": key, "sha256": _digest(dict(body)), "body": dict(body)}
        try:
            if not self._usable_folder():
                raise OSError("not a directory of the run (a link, or another kind of file)")
            self.folder.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(path, json.dumps(doc, sort_keys=True).encode())
        except OSError as err:
            log.warning("could not keep the derived %s in %s (%s)", what, self.folder, err)
            return False
        for stale in self.folder.glob(f"{what}-*.json"):
            try:
                if stale != path and stat.S_ISREG(stale.lstat().st_mode):  # files, not links
                    stale.unlink()
            except OSError as err:
                log.warning("could not remove the stale derived cache %s (%s)", stale, err)
        return True


def _read_regular(path: Path) -> str:
    """Read a regular file of at most ``MAX_BYTES``, following no link and never blocking.

    A FIFO, a device or a link at the name (planted, or left by another tool) is refused with
    ``OSError`` before a byte is read; so is a file too large for a selection.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path.name} is not a regular file")
        if info.st_size > MAX_BYTES:
            raise OSError(f"{path.name} holds {info.st_size:,} bytes, more than a selection")
        return handle.read(MAX_BYTES + 1).decode()
