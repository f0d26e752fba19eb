"""Telling a damaged store file from a bad environment: the header, the WAL, SQLite's errors.

Plain functions of the file (composed into ``HistoryStore``, ``sqlite``): ``check_header`` and
``wal_damage`` before and after an open; ``sqlite_errors`` translates every SQLite error of a
store operation into ``HistoryCorruptError`` (the file is damaged) or ``HistoryError`` (disk,
permissions, another program).
"""

from __future__ import annotations

import os
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fedunlearn.errors import HistoryCorruptError, HistoryError

__all__ = ["check_header", "sqlite_errors", "wal_damage"]

_SQLITE_HEADER = b"SQLite format 3\x00"
# SQLite primary result codes (sqlite3.h) that mean "this file is damaged".
_CORRUPT_CODES = frozenset({11, 24, 26})  # SQLITE_CORRUPT, SQLITE_FORMAT, SQLITE_NOTADB
_SHORT_READ = 522  # SQLITE_IOERR_SHORT_READ: the file ends before a page it points to


def check_header(file: Path) -> None:
    """Raise HistoryCorruptError if ``file`` is not a whole SQLite database."""
    size = file.stat().st_size
    with file.open("rb") as fh:
        header = fh.read(100)
    if len(header) < 100 or not header.startswith(_SQLITE_HEADER):
        raise HistoryCorruptError(
            f"{file}: not a SQLite database (bad header, {size} bytes), so not a fedunlearn "
            "history store; nothing was changed. Restore it from a backup or start a new run."
        )
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    header_valid = header[24:28] == header[92:96]
    wal = file.with_name(file.name + "-wal")
    hot_wal = wal.exists() and wal.stat().st_size > 0  # pages may live in the WAL
    if header_valid and pages and not hot_wal and size < pages * page_size:
        raise HistoryCorruptError(
            f"{file}: truncated: the header says {pages * page_size} bytes, the file has {size}; "
            "nothing was changed. Restore it from a backup or start a new run."
        )


def wal_damage(file: Path) -> str | None:
    """Say whether SQLite dropped committed transactions of the WAL for a damaged frame.

    SQLite reads the write-ahead log up to its first frame that fails its checksum and ignores
    the rest, as after a torn write; so a damaged frame in the middle of the log silently rolls
    the store back to an earlier commit (rounds, a continuation's rounds). The log's frames
    after the last valid one (``mxFrame`` in the wal-index) that carry the log's current salt
    and a commit mark were written after the damaged frame: one may be the torn last
    transaction of a crash, two or more mean committed transactions would be lost. Skipped
    (None) while another process writes (the wal-index changes during the look).
    """
    wal, shm = (file.with_name(file.name + suffix) for suffix in ("-wal", "-shm"))
    try:
        if not wal.exists() or wal.stat().st_size <= 32 or not shm.exists():
            return None
        before = shm.read_bytes()[:48]
        with wal.open("rb") as fh:
            header = fh.read(32)
            frame = 24 + int.from_bytes(header[8:12], "big")
            valid = int.from_bytes(before[16:20], sys.byteorder)  # mxFrame
            if before[32:40] != header[16:24]:  # the wal-index describes another log
                return None
            lost = 0
            fh.seek(32 + valid * frame)
            while len(head := fh.read(24)) == 24:
                if head[8:16] == header[16:24] and int.from_bytes(head[4:8], "big"):
                    lost += 1
                fh.seek(frame - 24, os.SEEK_CUR)
        if shm.read_bytes()[:48] != before or lost < 2:
            return None
    except OSError:
        return None
    offset = 32 + valid * frame
    return (
        f"{wal}: the write-ahead log is damaged after frame {valid}: {lost} commit(s) written "
        "after it (e.g. rounds since the last checkpoint) would be dropped without a word; "
        f"nothing was changed. Keep a copy of {file.parent}, then drop the damaged end of the "
        f"log with 'truncate -s {offset} {wal}' (what SQLite would do) and resume or continue "
        "the run, which retrains what was lost; or restore it from a backup."
    )


@contextmanager
def sqlite_errors(file: Path, action: str) -> Iterator[None]:
    """Translate SQLite errors into HistoryError / HistoryCorruptError naming the file."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        code = getattr(exc, "sqlite_errorcode", None)
        # without a SQLite code the error is the sqlite3 module's own reading of a value:
        # a plain DatabaseError, or text that is not UTF-8 (a damaged page): damage too
        corrupt = (
            code is None and (type(exc) is sqlite3.DatabaseError or "decode to UTF-8" in str(exc))
        ) or (code is not None and (code & 0xFF in _CORRUPT_CODES or code == _SHORT_READ))
        if corrupt:
            raise HistoryCorruptError(
                f"{file}: SQLite reports '{exc}' while {action}: the file is damaged or "
                "truncated; nothing was changed. Restore it from a backup, or start a new run."
            ) from exc
        raise HistoryError(
            f"{file}: SQLite error while {action}: {exc} "
            f"({getattr(exc, 'sqlite_errorname', type(exc).__name__)}); nothing was changed. "
            "Check disk space and permissions, and that no other program writes the file."
        ) from exc
