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

The part of a payload stored in its b-tree page (at most ``usable_size - 35`` bytes: all of a
payload under ~16 KB, e.g. every update of a small model) lands at an offset the row's size does
not fix. It gets *anchor* fingerprints instead (``anchor_prints``): the digests of the 32-byte
windows that start where the payload's bytes themselves say so (a content-defined anchor: the
hash of the 8 bytes there is 0 modulo ``ANCHOR_EVERY``), up to ``MAX_ANCHORS`` per payload;
``scan_pages`` finds the same anchors in every table-leaf page (and leaf frame of the WAL)
wherever the cell sits. So every payload of at least 40 varied bytes has a fingerprint, and a
run of a small model no longer holds an empty ledger (issue 33: 0 fingerprint bytes for the
300 updates of a 20-client run of 2.6 KB updates).

Limits, stated where the result is shown: the scan sees the files, not blocks the file system
or the device kept; a payload shorter than 40 bytes, or of one repeated byte, has no
fingerprint (the scan says so). The scan is calibrated on live payloads: if it cannot find
the pages of a payload that is still stored, the check says the scan is inconclusive.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "ANCHOR_EVERY",
    "MAX_ANCHORS",
    "DeletedPayload",
    "DeletionCheck",
    "DeletionRecord",
    "DroppedModel",
    "FINGERPRINT_BYTES",
    "anchor_prints",
    "fingerprints",
    "local_size",
    "prints_of",
    "overflow_offsets",
    "record_size",
    "scan_pages",
]

FINGERPRINT_BYTES = 8  # BLAKE2b digest size per overflow page
_WINDOW = 32  # payload bytes hashed per overflow page
_WAL_HEADER, _WAL_FRAME_HEADER = 32, 24  # SQLite WAL format: file header, per-frame header
ANCHOR_EVERY = 64  # about one anchor per this many bytes of a payload's local part
MAX_ANCHORS = 16  # anchor fingerprints kept per payload
_ANCHOR_KEY = 8  # bytes whose hash decides an anchor
_TABLE_LEAF = 0x0D  # b-tree page type of a table leaf (file format 1.6)
_MULT = np.uint64(0x9E3779B97F4A7C15)
_SALT = np.uint64(0xD6E8FEB86659FD93)  # so a run of zero bytes (a zeroed cell) is no anchor
_VARIETY = 8  # distinct byte values an anchor's window needs (zeroed space plus a stray byte
# matched a deleted payload's near-zero window: measured, issue 33)


class _Deleted:
    """What a deleted payload and a dropped model share: ``to_dict``."""

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        fields: dict[str, Any] = asdict(self)  # type: ignore[call-overload]
        return fields


@dataclass(frozen=True)
class DeletedPayload(_Deleted):
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


@dataclass(frozen=True)
class DroppedModel(_Deleted):
    """A global model or aggregate ``forget()`` dropped so that no deleted update can be rebuilt.

    Attributes:
        round: Round it belonged to.
        kind: ``"global"`` (M_round) or ``"aggregate"`` (the round's aggregated delta).
        size_bytes: As for ``DeletedPayload``.
        sha256: As for ``DeletedPayload``.
        num_fingerprints: As for ``DeletedPayload``.
    """

    round: int
    kind: str
    size_bytes: int
    sha256: str
    num_fingerprints: int


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
        missing_models: ``(round, kind)`` of global models and aggregates the catalogue says
            a round kept that are gone with no deletion record (raw SQL).
        scalars_kept: ``(round, client)`` rows of forgotten clients that still hold the
            ``norm`` or ``<Δ_c, G_t>`` of their deleted update (what rebuilds it).
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
    missing_models: tuple[tuple[int, str], ...] = ()
    scalars_kept: tuple[tuple[int, int], ...] = ()

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
            "missing_models": [list(m) for m in self.missing_models],
            "scalars_kept": [list(p) for p in self.scalars_kept],
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


def _anchors(data: np.ndarray) -> np.ndarray:
    """Offsets in ``data`` (uint8) where an anchor starts (content-defined, any alignment)."""
    if len(data) < _WINDOW:
        return np.empty(0, dtype=np.int64)
    keys = np.lib.stride_tricks.sliding_window_view(data[: len(data) - _WINDOW + _ANCHOR_KEY], 8)
    packed = keys.copy().view(np.uint64).reshape(-1)  # 8 bytes -> one word, little endian
    with np.errstate(over="ignore"):
        mixed = ((packed ^ _SALT) * _MULT) >> np.uint64(40)
    return np.flatnonzero(mixed % np.uint64(ANCHOR_EVERY) == 0)


def _window_ok(window: bytes) -> bool:
    """An anchor window worth a fingerprint: full length and varied (not near-constant)."""
    return len(window) == _WINDOW and len(set(window)) >= _VARIETY


def anchor_prints(row: Sequence[object], usable: int, limit: int | None = MAX_ANCHORS) -> bytes:
    """Return the anchor fingerprints of the part of ``row``'s BLOB kept in its b-tree page.

    The BLOB is the row's last column; its first ``local_size - header`` bytes sit in the
    cell of a table-leaf page (all of it when the row fits the page). Up to ``limit`` digests
    (None: every anchor), each of the 32 bytes from an anchor on.
    """
    blob = row[-1]
    if not isinstance(blob, bytes | bytearray | memoryview):
        return b""
    data = memoryview(blob).cast("B")
    size = record_size(row)
    local = local_size(size, usable) - (size - len(data))
    part = np.frombuffer(data[: max(0, local)], dtype=np.uint8)
    out: list[bytes] = []
    for offset in _anchors(part):
        window = bytes(part[offset : offset + _WINDOW])
        if _window_ok(window):
            out.append(_digest(window))
            if len(out) == limit:
                break
    return b"".join(out)


def page_anchor_prints(page: bytes) -> set[bytes]:
    """Every anchor digest in a page (a table leaf's content, wherever its cells sit)."""
    data = np.frombuffer(page, dtype=np.uint8)
    found = set()
    for offset in _anchors(data):
        window = page[offset : offset + _WINDOW]
        if _window_ok(window):
            found.add(_digest(window))
    return found


def prints_of(row: Sequence[object], usable: int) -> bytes:
    """Every fingerprint of a payload row: its overflow pages' and its local part's anchors."""
    return fingerprints(row, usable) + anchor_prints(row, usable)


def split_fingerprints(blob: bytes) -> list[bytes]:
    """Split a concatenation made by ``fingerprints``."""
    n = FINGERPRINT_BYTES
    return [blob[i : i + n] for i in range(0, len(blob), n)]


def _is_leaf(page: bytes, first: bool) -> bool:
    """Whether a page is a table leaf (page 1 keeps its b-tree header after the file header)."""
    at = 100 if first else 0
    return len(page) > at and page[at] == _TABLE_LEAF


def scan_pages(database: Path, page_size: int, wanted: Iterable[bytes]) -> tuple[set[bytes], int]:
    """Look for fingerprints in every page of ``database`` and every frame of its WAL.

    Every page: the 32 bytes after an overflow page's 4-byte pointer (``fingerprints``). Every
    table-leaf page: each anchor's 32 bytes too (``anchor_prints``), wherever its cells sit.

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
                page = os.pread(fd, page_size, start)
                pages += 1
                window = page[4 : 4 + _WINDOW]
                if len(window) == _WINDOW and _digest(window) in wanted:
                    found.add(_digest(window))
                if _is_leaf(page, file == database and start == 0):
                    found |= page_anchor_prints(page) & wanted
        finally:
            os.close(fd)
    return found, pages
