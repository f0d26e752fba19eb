"""Evidence that forgotten payloads are gone: deletion records, page fingerprints, the page scan.

``HistoryStore.forget()`` keeps one ``DeletionRecord`` per call: the clients, the time, the file
size before and after, and for every payload it deleted the round, client, size and SHA-256 of
the stored bytes, computed just before the deletion. ``HistoryStore.check_deletions()`` then
shows two things: every recorded payload is unreadable (a read raises ``ForgottenDataError``),
and none of its pages is still in the files.

The second check cannot search for the deleted bytes (the store must not keep them). Instead it
uses where SQLite puts a large BLOB: a row bigger than a page keeps its first part in a b-tree
page and the rest in a chain of *overflow pages*, each starting with a 4-byte pointer followed by
``usable_size - 4`` bytes of the row (SQLite file format, section 1.6, "B-tree Pages", cell
payload overflow). Where each chunk of a payload lands is a function of the row's size alone
(``overflow_offsets``), so ``forget()`` records a *fingerprint* of each overflow page the payload
filled (an 8-byte BLAKE2b digest of the page's first 32 content bytes, which are payload bytes),
and ``scan_pages`` reads those 32 bytes of every page of the database file and of every frame of
its WAL and looks the digests up. A digest reveals nothing usable about the deleted values.

Every payload's fingerprints are also written, when it is stored, to a ledger
(``payload_prints``) that outlives it, so the scan looks for updates deleted outside ``forget()``
too (``DeletionCheck.unrecorded``); the models ``forget()`` drops (``DroppedModel``) are recorded
and scanned for like the updates.

Limits, stated where the result is shown: the part of a payload stored in its b-tree page (at
most ``usable_size - 35`` bytes: all of a payload under ~16 KB) has no fingerprint, so the scan
covers all but the first ~2-16 KB of large payloads and nothing of small ones (``secure_delete``
zeroes those cells all the same); the scan sees the files, not blocks the file system or the
device kept. The scan is calibrated on live payloads: if it cannot find the pages of a payload
that is still stored, the check says the scan is inconclusive instead of passing.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DeletedPayload",
    "DeletionCheck",
    "DeletionRecord",
    "DroppedModel",
    "FINGERPRINT_BYTES",
    "fingerprints",
    "local_size",
    "overflow_offsets",
    "record_size",
    "scan_pages",
]

FINGERPRINT_BYTES = 8  # BLAKE2b digest size per overflow page
_WINDOW = 32  # payload bytes hashed per overflow page
_WAL_HEADER, _WAL_FRAME_HEADER = 32, 24  # SQLite WAL format: file header, per-frame header


@dataclass(frozen=True)
class DeletedPayload:
    """One payload ``forget()`` deleted.

    Attributes:
        round: Round it belonged to.
        client_id: Client it came from.
        size_bytes: Tensor bytes deleted.
        sha256: Hex SHA-256 of the stored bytes, computed before the deletion.
        num_fingerprints: Overflow pages recorded for the page scan (0: the payload fitted in
            its b-tree page, so the scan cannot look for it).
    """

    round: int
    client_id: int
    size_bytes: int
    sha256: str
    num_fingerprints: int

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True)
class DroppedModel:
    """A global model or aggregate ``forget()`` dropped so that no deleted update can be rebuilt.

    Attributes:
        round: Round it belonged to.
        kind: ``"global"`` (M_round) or ``"aggregate"`` (the round's aggregated delta).
        size_bytes: Tensor bytes deleted.
        sha256: Hex SHA-256 of the stored bytes, computed before the deletion.
        num_fingerprints: Overflow pages recorded for the page scan.
    """

    round: int
    kind: str
    size_bytes: int
    sha256: str
    num_fingerprints: int

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True)
class DeletionRecord:
    """What one ``forget()`` call deleted, kept in the store.

    Attributes:
        id: Sequence number of the call in this store (1, 2, ...).
        forgotten_at: Unix time of the deletion's commit, seconds.
        client_ids: Clients the call forgot (ids forgotten before included: 0 bytes).
        payloads: Each deleted payload, by round and client.
        size_bytes: Tensor bytes deleted (sum over ``payloads``).
        file_bytes_before: Database file plus WAL before the call.
        file_bytes_after: The same after the space was reclaimed (None if the call was
            interrupted before it finished).
        vacuum: ``"incremental"`` (freed pages given back, the rest untouched) or ``"full"``
            (the whole file rebuilt).
        models: The global models and aggregates the call dropped (with the updates still
            stored they would let a deleted update be rebuilt; see ``reconstruction``).
    """

    id: int
    forgotten_at: float
    client_ids: tuple[int, ...]
    payloads: tuple[DeletedPayload, ...]
    size_bytes: int
    file_bytes_before: int
    file_bytes_after: int | None
    vacuum: str
    models: tuple[DroppedModel, ...] = ()

    @property
    def model_bytes(self) -> int:
        """Tensor bytes of the dropped models (not in ``size_bytes``, which counts updates)."""
        return sum(m.size_bytes for m in self.models)

    @property
    def bytes_reclaimed(self) -> int | None:
        """Bytes the files shrank by (None if unknown)."""
        if self.file_bytes_after is None:
            return None
        return self.file_bytes_before - self.file_bytes_after

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {
            "id": self.id,
            "forgotten_at": self.forgotten_at,
            "client_ids": list(self.client_ids),
            "size_bytes": self.size_bytes,
            "file_bytes_before": self.file_bytes_before,
            "file_bytes_after": self.file_bytes_after,
            "bytes_reclaimed": self.bytes_reclaimed,
            "vacuum": self.vacuum,
            "payloads": [p.to_dict() for p in self.payloads],
            "model_bytes": self.model_bytes,
            "models": [m.to_dict() for m in self.models],
        }


@dataclass(frozen=True)
class DeletionCheck:
    """Result of ``HistoryStore.check_deletions()``.

    Attributes:
        ok: Every recorded payload is unreadable, no fingerprint was found and the scan found
            the pages of the live payloads it was calibrated on.
        payloads_checked: Deleted payloads looked at.
        unreadable: How many of them a read refuses.
        fingerprints_checked: Overflow-page fingerprints looked for.
        fingerprints_found: How many were found in the files (0 when the bytes are gone).
        not_scanned: Deleted payloads with no fingerprint (they fitted in a b-tree page).
        control_checked: Fingerprints of live payloads looked for (the calibration).
        control_found: How many were found (all, when the scan works).
        pages_scanned: Database pages plus WAL frames read.
        problems: One line per problem found.
        unrecorded: ``(round, client)`` of updates of these clients that the fingerprint ledger
            says were stored but that are gone with no deletion record (deleted outside
            ``forget()``, e.g. by raw SQL); their fingerprints are scanned for too.
        inconclusive_reason: Why the scan cannot show that every deleted payload of these
            clients is gone (None when it can): the scan's calibration failed, payloads went
            outside ``forget()`` before the ledger existed, or such payloads had no overflow
            page to look for.
    """

    ok: bool
    payloads_checked: int
    unreadable: int
    fingerprints_checked: int
    fingerprints_found: int
    not_scanned: int
    control_checked: int
    control_found: int
    pages_scanned: int
    problems: tuple[str, ...] = field(default_factory=tuple)
    unrecorded: tuple[tuple[int, int], ...] = ()
    inconclusive_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {
            "ok": self.ok,
            "payloads_checked": self.payloads_checked,
            "unreadable": self.unreadable,
            "fingerprints_checked": self.fingerprints_checked,
            "fingerprints_found": self.fingerprints_found,
            "not_scanned": self.not_scanned,
            "control_checked": self.control_checked,
            "control_found": self.control_found,
            "pages_scanned": self.pages_scanned,
            "problems": list(self.problems),
            "unrecorded": [list(p) for p in self.unrecorded],
            "inconclusive_reason": self.inconclusive_reason,
        }


def _varint_len(value: int) -> int:
    n = 1
    while value >= 0x80 and n < 9:
        value >>= 7
        n += 1
    return n


def _serial(value: object) -> tuple[int, int]:
    """Return (serial type, body bytes) of a column value (SQLite file format 2.1)."""
    if value is None:
        return 0, 0
    if isinstance(value, int):
        if value in (0, 1):  # schema format 4: constants 0 and 1 take no body bytes
            return 8 + value, 0
        for serial, size in ((1, 1), (2, 2), (3, 3), (4, 4), (5, 6)):
            if -(1 << (8 * size - 1)) <= value < (1 << (8 * size - 1)):
                return serial, size
        return 6, 8
    if isinstance(value, float):
        return 7, 8
    if isinstance(value, str):
        size = len(value.encode())
        return 13 + 2 * size, size
    size = len(value)  # type: ignore[arg-type]
    return 12 + 2 * size, size


def record_size(values: Sequence[object]) -> int:
    """Return the size of the SQLite record holding ``values`` (a rowid alias counts as None)."""
    types = [_serial(v) for v in values]
    types_len = sum(_varint_len(t) for t, _ in types)
    header = types_len + 1
    if _varint_len(header) > 1:  # the header size varint counts itself
        header = types_len + _varint_len(types_len + 2)
    return header + sum(size for _, size in types)


def local_size(payload: int, usable: int) -> int:
    """Return the bytes of a table-leaf cell payload kept in its b-tree page (file format 1.6)."""
    max_local = usable - 35
    min_local = (usable - 12) * 32 // 255 - 23
    if payload <= max_local:
        return payload
    k = min_local + (payload - min_local) % (usable - 4)
    return k if k <= max_local else min_local


def overflow_offsets(row_size: int, blob_size: int, usable: int) -> list[int]:
    """Return the offsets in a row's last-column BLOB where each overflow page's content starts.

    Args:
        row_size: Size of the whole record (``record_size``).
        blob_size: Size of the BLOB, which must be the record's last column.
        usable: The database's usable page size (page size minus reserved bytes).
    """
    local = local_size(row_size, usable)
    if local == row_size:
        return []
    start = local - (row_size - blob_size)  # the BLOB is the record's tail
    return list(range(start, blob_size, usable - 4))


def _digest(window: bytes) -> bytes:
    return hashlib.blake2b(window, digest_size=FINGERPRINT_BYTES).digest()


def fingerprints(row: Sequence[object], usable: int) -> bytes:
    """Return the concatenated fingerprints of the overflow pages of ``row`` (BLOB last).

    Windows shorter than 32 bytes (the end of the last page) and windows of one repeated byte
    (zeros look like any zeroed page) get no fingerprint.
    """
    blob = row[-1]
    if not isinstance(blob, bytes | bytearray | memoryview):
        return b""
    data = memoryview(blob).cast("B")  # no copy of the payload: only the windows are read
    out = []
    for offset in overflow_offsets(record_size(row), len(data), usable):
        window = bytes(data[offset : offset + _WINDOW])
        if len(window) == _WINDOW and window.count(window[:1]) != _WINDOW:
            out.append(_digest(window))
    return b"".join(out)


def split_fingerprints(blob: bytes) -> list[bytes]:
    """Split a concatenation made by ``fingerprints``."""
    n = FINGERPRINT_BYTES
    return [blob[i : i + n] for i in range(0, len(blob), n)]


def scan_pages(database: Path, page_size: int, wanted: Iterable[bytes]) -> tuple[set[bytes], int]:
    """Look for fingerprints in every page of ``database`` and every frame of its WAL.

    Args:
        database: The SQLite file; ``<database>-wal`` is read too if present.
        page_size: The database page size.
        wanted: Fingerprints to look for.

    Returns:
        The fingerprints found, and the number of pages and frames read.
    """
    wanted = set(wanted)
    found: set[bytes] = set()
    pages = 0
    wal = database.with_name(database.name + "-wal")
    layouts = [(database, 0, page_size)]
    if wal.exists():
        layouts.append((wal, _WAL_HEADER + _WAL_FRAME_HEADER, _WAL_FRAME_HEADER + page_size))
    for file, first, stride in layouts:
        fd = os.open(file, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            for start in range(first, size - page_size + 1, stride):
                window = os.pread(fd, _WINDOW, start + 4)
                pages += 1
                if len(window) == _WINDOW:
                    digest = _digest(window)
                    if digest in wanted:
                        found.add(digest)
        finally:
            os.close(fd)
    return found, pages
