"""On-disk history of a federated run: one SQLite file, atomic rounds, forgetting that deletes.

The store owns ``<run dir>/history.sqlite``: the global model of each kept round (round 0 is
M_0), each round's aggregate delta, the clients' update deltas (convention in
:mod:`fedunlearn.fl.records`: ``M_{t+1} = M_t + aggregate``), a record per sampled client
(accepted, rejected or missing; norm, loss, reason), per-round scalars, the run's metadata and a
log of every ``forget()``. What to keep is the policy's business; the store keeps what it is
given, counts its bytes exactly and deletes them for real.

Design:
    * Catalog and payloads in one SQLite file, payloads as BLOBs. One ``BEGIN IMMEDIATE`` ...
      ``COMMIT`` per round makes a round all or nothing with no manifest, temp files or renames:
      a crash at any instant (kill -9, OOM) leaves every committed round intact and no trace of
      the round in flight.
    * ``write_round(entry, attach=...)`` also stores updates of earlier committed rounds in the
      round's transaction: a deferred policy (Crab's window selection) decides what to keep of
      a round only when its window closes, and the selection is then stored whole or not at all.
    * WAL journal: readers (an unlearning job, a report) read committed rounds while the writer
      appends the next one. Cost: every byte is written twice (WAL, then checkpoint).
    * ``synchronous=FULL``. With WAL, NORMAL already survives a process crash (a commit is in
      the OS page cache once ``COMMIT`` returns) but not a power loss, which may roll back the
      last commits, including a ``forget()``, and so bring deleted updates back. FULL adds one
      fsync of the WAL per commit; at one commit per round of tens of MB that is cheap.
    * ``auto_vacuum=INCREMENTAL`` and ``secure_delete=ON``: ``forget()`` deletes a client's
      payloads (SQLite zeroes every freed page) and, in the same transaction, runs
      ``incremental_vacuum``, which moves pages from the end of the file into the freed ones and
      cuts the file; then ``wal_checkpoint(TRUNCATE)`` cuts the WAL, which held the zeroed and
      moved pages, to zero bytes. Work and extra disk are proportional to the forgotten bytes,
      not to the file: one client of the 2 GB paper-scale history takes 0.64 s and 95 MB of
      extra disk, a full ``VACUUM``, which rewrites the whole file, 13.6 s and 3.4 GB
      (medians side by side, docs/performance.md).
      ``forget(vacuum="full")`` keeps that path; a store written before auto_vacuum was on gets
      it once, on its first ``forget()``, which also converts the file. Not covered: blocks the
      file system or an SSD keeps after an overwrite, backups, the OS page cache; use disk
      encryption for those.
    * Each ``forget()`` call (``erasure.py``) leaves a deletion record (``deletion.py``): per
      deleted payload its round, client, size, SHA-256 (computed before the deletion) and
      fingerprints of its overflow pages, so ``check_deletions()`` can show later that reads
      fail and that no page of it is left in the files. ``forget()`` also drops the aggregates
      and global models that would let a deleted update be rebuilt (``reconstruction.py``),
      recorded the same way; reading one raises ``DroppedModelError``.
    * A fingerprint ledger (``payload_prints``): every payload's page fingerprints are written
      in its round's transaction and kept after the payload goes, so the page scan can look
      for payloads deleted outside ``forget()`` (raw SQL leaves their pages in the file).
      Each client's row also says when its update was kept (``stored_at``), so an update gone
      without a deletion record is seen even when its ledger row went with it
      (``check_deletions``: ``unrecorded``).
    * A CRC-32 per payload, checked on every read. It catches accidental damage (torn writes,
      bit rot, bad copies); it is not a MAC (whoever can edit the file can recompute any
      checksum kept in it). zlib's crc32 runs at ~3 GB/s here, sha256 at ~0.9 GB/s.
    * One writer at a time, enforced by ``flock`` on ``history.lock`` (the kernel drops it when
      the process dies, so a killed writer leaves no stale lock). Readers take no lock. flock is
      unreliable on some network file systems: keep run directories on a local disk. A caller
      that must hold the lock before the store exists (a run directory, before it writes
      anything) takes a ``WriterLock`` and hands it to ``create`` or ``open``.
    * Applied unlearning results (``events.py``): ``apply()`` makes an unlearned model the
      run's model in one transaction (replacing rounds 1..T by the method's trajectory, or
      appending the model as round T+1) and records the event; ``forgotten_clients()`` is the
      union every later request forgets. Stores written before the table get it on their first
      writable open and read as having no events until then.
    * A hash chain (``chain.py``): every transaction that changes what the store holds (a
      round, a ``forget()``, an ``apply()``, a truncation) appends a link committing to it and
      to the previous link, in the same transaction; ``check()`` replays the links and compares
      the store with them, so a payload or round removed outside ``forget()`` is damage. A
      store written before the chain has none and never gets one.
    * ``check()`` (``integrity.py``) looks for damage without changing anything (every
      checksum, or a quick pass over the catalog and the models) and names the first bad round,
      from which a run can be retrained (``truncate_after(first_bad_round - 1)``).
    * Reads stream: ``iter_updates`` fetches one payload per step, and there is no mmap, so a
      reader holds one payload plus SQLite's 2 MiB page cache, never a round or the history.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import sqlite3
import sys
import time
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from fedunlearn.errors import (
    ConfigError,
    ForgottenDataError,
    HistoryCorruptError,
    HistoryError,
    UnsupportedHistoryError,
)
from fedunlearn.fl.records import UpdateStatus
from fedunlearn.history.digest import canonical_sha256
from fedunlearn.history.store.chain import CHAIN_INFO_KEY, CHAIN_SCHEMA, Chain
from fedunlearn.history.store.codec import (
    NO_CLIENT,
    PayloadError,
    decode,
    encode,
    from_real,
    shard_key,
    to_real,
)
from fedunlearn.history.store.deletion import prints_of
from fedunlearn.history.store.erasure import Erasure
from fedunlearn.history.store.events import EVENT_SCHEMA, EVENT_TABLES, Generations
from fedunlearn.history.store.integrity import Integrity
from fedunlearn.history.store.records import (
    ClientRecord,
    ForgetRecord,
    RoundEntry,
    Scalar,
    check_int,
    check_tensor,
    format_ids,
)

__all__ = [
    "FILE_NAME",
    "LOCK_NAME",
    "SCHEMA_VERSION",
    "DroppedModelError",
    "HistoryStore",
    "WriterLock",
]

SCHEMA_VERSION = 1
FILE_NAME = "history.sqlite"
LOCK_NAME = "history.lock"
MODEL_KINDS = ("global", "aggregate")
_FORMAT = "fedunlearn-history"
_PAGE_SIZE = 16384  # fewer overflow pages per multi-MB blob than 4096; see benchmarks/
_BUSY_TIMEOUT_MS = 10_000
_SQLITE_HEADER = b"SQLite format 3\x00"
_SCHEMA = """
CREATE TABLE info (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE rounds (
    round INTEGER PRIMARY KEY, scalars TEXT NOT NULL, committed_at REAL NOT NULL);
CREATE TABLE clients (
    round INTEGER NOT NULL REFERENCES rounds(round), client_id INTEGER NOT NULL,
    status TEXT NOT NULL, num_samples INTEGER NOT NULL, norm REAL, loss REAL, reason TEXT,
    scalars TEXT NOT NULL, forgotten_at REAL, stored_at REAL, PRIMARY KEY (round, client_id));
CREATE INDEX clients_by_id ON clients(client_id);
CREATE TABLE payloads (
    id INTEGER PRIMARY KEY, round INTEGER NOT NULL REFERENCES rounds(round),
    kind TEXT NOT NULL CHECK (kind IN ('global', 'aggregate', 'update')),
    client_id INTEGER NOT NULL, dtype TEXT NOT NULL, shape TEXT NOT NULL,
    size_bytes INTEGER NOT NULL, crc32 INTEGER NOT NULL, data BLOB NOT NULL,
    UNIQUE (round, kind, client_id));
CREATE INDEX payloads_by_client ON payloads(client_id);
CREATE TABLE forget_log (
    id INTEGER PRIMARY KEY, client_id INTEGER NOT NULL, forgotten_at REAL NOT NULL,
    size_bytes INTEGER NOT NULL, num_payloads INTEGER NOT NULL);
"""
# The deletion record (one row per forget() call, one per deleted payload). Added without a
# schema version bump: a store that lacks the tables (written before they existed) gets them on
# its first writable open, and reads as having no deletion records until then.
_DELETION_SCHEMA = """
CREATE TABLE forget_calls (
    id INTEGER PRIMARY KEY, forgotten_at REAL NOT NULL, client_ids TEXT NOT NULL,
    size_bytes INTEGER NOT NULL, file_bytes_before INTEGER NOT NULL, file_bytes_after INTEGER,
    vacuum TEXT NOT NULL, page_size INTEGER NOT NULL);
CREATE TABLE forget_payloads (
    call_id INTEGER NOT NULL REFERENCES forget_calls(id), round INTEGER NOT NULL,
    client_id INTEGER NOT NULL, size_bytes INTEGER NOT NULL, sha256 TEXT NOT NULL,
    fingerprints BLOB NOT NULL, PRIMARY KEY (call_id, round, client_id));
"""
# The fingerprint ledger (one row per payload ever written, kept when the payload goes) and the
# record of the models a forget() dropped. Added like the deletion record: a store that lacks
# them gets them on its first writable open, with ``prints_from_round`` (info) saying from which
# round on every written payload has its ledger row.
_LEDGER_SCHEMA = """
CREATE TABLE payload_prints (
    round INTEGER NOT NULL, kind TEXT NOT NULL, client_id INTEGER NOT NULL,
    size_bytes INTEGER NOT NULL, fingerprints BLOB NOT NULL,
    PRIMARY KEY (round, kind, client_id));
CREATE TABLE forget_models (
    call_id INTEGER NOT NULL REFERENCES forget_calls(id), round INTEGER NOT NULL,
    kind TEXT NOT NULL, size_bytes INTEGER NOT NULL, sha256 TEXT NOT NULL,
    fingerprints BLOB NOT NULL, PRIMARY KEY (call_id, round, kind));
"""
_TABLES = frozenset({"info", "rounds", "clients", "payloads", "forget_log"})
#: ``info`` key of the metadata's checksum (``HistoryStore.meta_problem``).
META_SHA256_KEY = "meta_sha256"
_DELETION_TABLES = frozenset({"forget_calls", "forget_payloads"})
_LEDGER_TABLES = frozenset({"payload_prints", "forget_models"})
# SQLite primary result codes (sqlite3.h) that mean "this file is damaged".
_CORRUPT_CODES = frozenset({11, 24, 26})  # SQLITE_CORRUPT, SQLITE_FORMAT, SQLITE_NOTADB
_SHORT_READ = 522  # SQLITE_IOERR_SHORT_READ: the file ends before a page it points to


def _check_header(file: Path) -> None:
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


def _wal_damage(file: Path) -> str | None:
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


# columns a writable open adds to a store written before them (``_add_deletion_tables``): a store
# without them is old, not damaged
_ADDED_COLUMNS: dict[str, tuple[str, ...]] = {"clients": ("stored_at",)}


@functools.cache
def _expected_columns() -> dict[str, list[str]]:
    """The column names of every table a store of this schema version has (built in memory)."""
    con = sqlite3.connect(":memory:")
    try:
        con.executescript(_SCHEMA + _DELETION_SCHEMA + _LEDGER_SCHEMA + EVENT_SCHEMA + CHAIN_SCHEMA)
        tables = [r for (r,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: [row[1] for row in con.execute(f"PRAGMA table_info({t})")] for t in tables}
    finally:
        con.close()


class DroppedModelError(ForgottenDataError, UnsupportedHistoryError):
    """A global model or aggregate ``forget()`` dropped was asked for.

    Both a ``ForgottenDataError`` (the data is gone on purpose) and an
    ``UnsupportedHistoryError`` (a method that needs it cannot serve the request: the error
    every method raises for a history that lacks what it reads).
    """


class WriterLock:
    """The one-writer lock of a store directory: ``flock`` on ``<dir>/history.lock``.

    ``HistoryStore.create`` and ``open(writable=True)`` take it themselves; take it first only
    to hold it before the store exists, then pass it to them (they own it from then on).
    """

    def __init__(self, fd: int, path: Path) -> None:
        """Wrap a locked descriptor; use ``acquire`` instead."""
        self._fd: int | None = fd
        self.path = path

    @classmethod
    def acquire(cls, path: Path) -> WriterLock:
        """Take the writer lock of directory ``path`` (which must exist), without waiting.

        Raises:
            HistoryError: Another process holds it.
        """
        path = Path(path)
        fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise HistoryError(
                f"{path}: another writer holds {path / LOCK_NAME} (a train, resume or forget "
                "of this history); one writer at a time. Wait for it to finish, or open the store "
                "read-only meanwhile."
            ) from None
        return cls(fd, path)

    @property
    def held(self) -> bool:
        """Whether the lock is still held."""
        return self._fd is not None

    def release(self) -> None:
        """Release the lock; calling it again does nothing."""
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None


class HistoryStore(Erasure, Integrity, Generations, Chain):
    """The history of one run in ``<dir>/history.sqlite``; build with ``create`` or ``open``.

    A writable store holds ``<dir>/history.lock`` until ``close()``; use it as a context manager.
    Every read of a payload checks its CRC-32. A store is used from the thread that opened it.

    Example:
        >>> with HistoryStore.create(run_dir, {"seed": 0}) as store:  # doctest: +SKIP
        ...     store.write_round(RoundEntry(round=0, global_model=m0))
    """

    def __init__(self, con: sqlite3.Connection, file: Path, lock: WriterLock | None) -> None:
        """Wrap an open connection; use ``create`` or ``open`` instead."""
        self._con: sqlite3.Connection | None = con
        self._file = file
        self._lock = lock
        self._has_ledger: bool | None = None
        self._has_chain: bool | None = None
        self._chain_pending: dict[str, Any] | None = None
        self._stored_at: bool | None = None
        self._usable: int | None = None

    # ----- opening and closing -------------------------------------------------------------

    @classmethod
    def create(
        cls, path: Path, meta: Mapping[str, Any], *, lock: WriterLock | None = None
    ) -> HistoryStore:
        """Create an empty, writable store in directory ``path`` (made if missing).

        Args:
            path: Run directory; ``path/history.sqlite`` must not exist yet.
            meta: JSON-serialisable run metadata, e.g. the run config.
            lock: The directory's writer lock, if the caller holds it already; the store owns
                it from here on (released by ``close()``, or now if creating fails).

        Returns:
            The store, open for writing.

        Raises:
            HistoryError: The store exists already, or another process holds the lock.
            ConfigError: ``meta`` is not a JSON-serialisable dict.
        """
        path = Path(path)
        try:
            meta_json = cls._meta_json(meta)
            if not path.exists():  # a directory made here is its owner's only (0700)
                path.mkdir(parents=True)
                os.chmod(path, 0o700)
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        file = path / FILE_NAME
        lock = cls._own_lock(path, lock)
        if file.exists():
            lock.release()
            raise HistoryError(
                f"{file}: a history store exists already. Open it with "
                "HistoryStore.open(path, writable=True), or choose another run directory."
            )
        try:
            con = sqlite3.connect(file, isolation_level=None)
            os.chmod(file, 0o600)  # before any data; SQLite gives its WAL and SHM the same mode
            store = cls(con, file, lock)
            with store._sqlite("creating the store"):
                con.execute(f"PRAGMA page_size={_PAGE_SIZE}")  # before WAL, which fixes it
                con.execute("PRAGMA auto_vacuum=INCREMENTAL")  # before the first table
                store._configure()
                info = {
                    "format": _FORMAT,
                    "schema_version": str(SCHEMA_VERSION),
                    "meta": meta_json,
                    META_SHA256_KEY: canonical_sha256(json.loads(meta_json)),
                }
                # executescript leaves the transaction open
                con.executescript(
                    "BEGIN IMMEDIATE;"
                    + _SCHEMA
                    + _DELETION_SCHEMA
                    + _LEDGER_SCHEMA
                    + EVENT_SCHEMA
                    + CHAIN_SCHEMA
                )
                info["prints_from_round"] = "0"
                info["stored_from_round"] = "0"
                info[CHAIN_INFO_KEY] = "1"
                con.executemany("INSERT INTO info VALUES (?, ?)", info.items())
                store._chain_commit("genesis", created_at=time.time())  # chain.py
                con.execute("COMMIT")
        except BaseException:
            if "con" in locals():
                con.close()
            for suffix in ("", "-wal", "-shm"):
                file.with_name(file.name + suffix).unlink(missing_ok=True)
            lock.release()
            raise
        return store

    @classmethod
    def open(
        cls, path: Path, *, writable: bool = False, lock: WriterLock | None = None
    ) -> HistoryStore:
        """Open the store in directory ``path``.

        A writable open of a store written before the deletion record existed adds its tables.

        Args:
            path: Run directory holding ``history.sqlite``.
            writable: Open for writing (takes the writer lock); default read-only.
            lock: The directory's writer lock, if the caller holds it already (implies
                ``writable``); the store owns it from here on.

        Returns:
            The store.

        Raises:
            HistoryError: No store there, another writer holds the lock, or the store was
                written by a newer schema version.
            HistoryCorruptError: The file is not a valid store (bad header, missing tables,
                truncated).
        """
        file = Path(path) / FILE_NAME
        if not file.is_file():
            if lock is not None:
                lock.release()
            raise HistoryError(
                f"{file}: no history store here. Check the run directory, or create one with "
                "HistoryStore.create(path, meta)."
            )
        writable = writable or lock is not None
        lock = cls._own_lock(Path(path), lock) if writable else None
        try:
            _check_header(file)
            mode = "rw" if writable else "ro"
            con = sqlite3.connect(
                f"{file.resolve().as_uri()}?mode={mode}", uri=True, isolation_level=None
            )
            store = cls(con, file, lock)
            with store._sqlite("opening the store"):
                store._configure()
                store._check_schema()  # its reads recover the WAL: the wal-index is current
                damage = _wal_damage(file)
                if damage is not None:
                    raise HistoryCorruptError(damage)
                if writable:
                    store._add_deletion_tables()
        except BaseException:
            if "store" in locals():
                store.close()
            elif lock is not None:
                lock.release()
            raise
        return store

    def close(self) -> None:
        """Close the database and release the writer lock; calling it again does nothing."""
        if self._con is not None:
            if self._con.in_transaction:
                self._con.rollback()
            self._con.close()
            self._con = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def data_version(self) -> int:
        """A number that changes whenever another connection commits to the store.

        SQLite's ``PRAGMA data_version``: a reader compares it before and after a long read
        (an unlearning session) to learn whether an ``apply``, ``forget`` or continuation
        committed in between, so that what it read may mix two states of the run.
        """
        with self._sqlite("reading the data version"):
            return int(self._db.execute("PRAGMA data_version").fetchone()[0])

    def close_keeping_lock(self) -> WriterLock | None:
        """Close the database but hand the writer lock (if any) to the caller to release.

        For removing the store's files while no other writer can start (a fresh run that
        failed before its first trained round).
        """
        lock, self._lock = self._lock, None
        self.close()
        return lock

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._con is None else ("writable" if self.writable else "read-only")
        return f"HistoryStore({str(self._file)!r}, {state})"

    @property
    def file(self) -> Path:
        """Path of the SQLite file."""
        return self._file

    @property
    def writable(self) -> bool:
        """Whether this handle may write (it holds the writer lock)."""
        return self._lock is not None

    # ----- metadata -----------------------------------------------------------------------

    @property
    def meta(self) -> dict[str, Any]:
        """A copy of the run metadata given to ``create`` and ``update_meta``.

        Raises:
            HistoryCorruptError: The metadata is missing or not a JSON object.
        """
        with self._sqlite("reading meta"):
            row = self._db.execute("SELECT value FROM info WHERE key='meta'").fetchone()
        try:
            meta = json.loads(row[0]) if row is not None else None
        except (TypeError, ValueError):
            meta = None
        if not isinstance(meta, dict):
            raise HistoryCorruptError(
                f"{self._file}: the run's metadata is {'missing' if row is None else 'damaged'} "
                "(not a JSON object); nothing was changed. Restore the file from a backup."
            )
        return meta

    def meta_problem(self, meta: Mapping[str, Any] | None = None) -> str | None:
        """Say whether the metadata still matches the checksum written with it (None: it does).

        ``update_meta`` (and every write of the metadata) stores a SHA-256 of its canonical
        JSON (``history.digest``) in ``info``; metadata edited outside fedunlearn (e.g. the
        store's copy of the config) no longer matches it. A store written before the checksum
        existed has none: nothing to compare (None).

        Args:
            meta: Metadata to compare instead of the stored one (e.g. the stored metadata with
                a candidate config: does it give the checksum back?).
        """
        with self._sqlite("reading meta"):
            row = self._db.execute(
                "SELECT value FROM info WHERE key=?", (META_SHA256_KEY,)
            ).fetchone()
        if row is None:
            return None
        if canonical_sha256(self.meta if meta is None else dict(meta)) == row[0]:
            return None
        return (
            "metadata: the store's metadata (its copy of the run's config, clients and state) "
            "was changed after fedunlearn wrote it: its SHA-256 no longer matches the checksum "
            "stored with it"
        )

    @property
    def policy(self) -> str:
        """The recording policy the run used (``meta["history_policy"]``; "unknown" if unset)."""
        return str(self.meta.get("history_policy", "unknown"))

    def update_meta(self, values: Mapping[str, Any]) -> None:
        """Merge ``values`` into the metadata (``dict.update``) and commit.

        Raises:
            ConfigError: ``values`` is not a JSON-serialisable dict.
            HistoryError: The store is read-only.
        """
        self._require_writable("update the metadata")
        if not isinstance(values, Mapping):
            raise ConfigError(f"update_meta takes a dict; got {type(values).__name__}.")
        meta = self.meta | dict(values)
        self._meta_json(meta)  # refused before the transaction
        with self._transaction("updating meta"):
            self._put_meta(meta)

    def _put_meta(self, meta: Mapping[str, Any]) -> None:
        """Write the metadata and its checksum (inside the caller's transaction)."""
        text = self._meta_json(meta)
        self._db.execute("UPDATE info SET value=? WHERE key='meta'", (text,))
        self._db.execute(
            "INSERT OR REPLACE INTO info VALUES (?, ?)",
            (META_SHA256_KEY, canonical_sha256(json.loads(text))),
        )

    # ----- writing ------------------------------------------------------------------------

    def write_round(
        self,
        entry: RoundEntry,
        *,
        attach: Mapping[int, Mapping[int, torch.Tensor]] | None = None,
    ) -> None:
        """Commit one round in a single transaction: all of it is stored, or none of it.

        Args:
            entry: The round; its number must exceed every committed round.
            attach: Updates of *earlier*, already committed rounds to store in the same
                transaction, ``{round: {client_id: delta}}`` (deferred policies such as Crab's
                window selection decide what to keep of a round only later). Each client must
                have an accepted or rejected record in that round, no update stored there yet,
                and must not have been forgotten.

        Raises:
            HistoryError: The round is committed already or not after the last one, an update
                belongs to a forgotten client, an attached update has no client record, is
                stored already or names an uncommitted round, or the store is read-only.
            ConfigError: A payload is larger than SQLite's BLOB limit, or ``attach`` names
                round ``entry.round`` or later.
        """
        self._require_writable(f"write round {getattr(entry, 'round', '?')}")
        if not isinstance(entry, RoundEntry):
            raise ConfigError(f"write_round takes a RoundEntry; got {type(entry).__name__}.")
        r = entry.round
        late = {
            check_int(rr, "attach round"): {
                check_int(c, "attach client_id"): check_tensor(t, f"attach[{rr}][{c}]")
                for c, t in ups.items()
            }
            for rr, ups in (attach or {}).items()
            if ups
        }
        if any(rr >= r or rr == 0 for rr in late):
            raise ConfigError(
                f"write_round(round {r}) can attach updates of earlier rounds 1..{r - 1} only; "
                f"got rounds {sorted(late)}. Put this round's updates in entry.updates."
            )
        limit = self._db.getlimit(sqlite3.SQLITE_LIMIT_LENGTH)
        named = [
            ("global", NO_CLIENT, entry.global_model),
            ("aggregate", NO_CLIENT, entry.aggregate),
        ]
        payloads = [(r, k, c, t) for k, c, t in named if t is not None]
        payloads += [
            (r, "global", shard_key(s), entry.shard_models[s]) for s in sorted(entry.shard_models)
        ]
        payloads += [(r, "update", cid, entry.updates[cid]) for cid in sorted(entry.updates)]
        payloads += [
            (rr, "update", cid, late[rr][cid]) for rr in sorted(late) for cid in sorted(late[rr])
        ]
        for _, kind, cid, tensor in payloads:
            if tensor.numel() * tensor.element_size() > limit:
                raise ConfigError(
                    f"{self._file}: round {r} {self._what(kind, cid)} is "
                    f"{tensor.numel() * tensor.element_size()} bytes; SQLite BLOBs hold at most "
                    f"{limit}. Store smaller tensors; nothing was written."
                )
        with self._transaction(f"writing round {r}"):
            last = self._db.execute("SELECT max(round) FROM rounds").fetchone()[0]
            if last is not None and r <= last:
                exists = self._db.execute("SELECT 1 FROM rounds WHERE round=?", (r,)).fetchone()
                raise HistoryError(
                    f"{self._file}: round {r} "
                    + ("is committed already" if exists else f"comes before the last round {last}")
                    + f"; rounds are written in increasing order. To rewrite from round {r}, call "
                    f"truncate_after({r - 1}) (resume); nothing was written."
                )
            writers = set(entry.updates).union(*late.values())
            if writers:
                marks = ",".join("?" * len(writers))
                gone = self._db.execute(
                    f"SELECT DISTINCT client_id FROM forget_log WHERE client_id IN ({marks})",
                    tuple(sorted(writers)),
                ).fetchall()
                if gone:
                    raise HistoryError(
                        f"{self._file}: round {r} has updates of client(s) "
                        f"{format_ids(g[0] for g in gone)}, which were forgotten; drop them "
                        "from the round. Nothing was written."
                    )
            for rr in sorted(late):
                self._check_attachable(rr, late[rr])
            self._insert_round_rows(entry, time.time())
            for rr, kind, cid, tensor in payloads:
                self._insert_payload(rr, kind, cid, tensor)
            self._chain_commit("round", round=r)

    def _insert_round_rows(self, entry: RoundEntry, now: float) -> None:
        """Insert a round's row and its clients' rows (inside the caller's transaction)."""
        r = entry.round
        scalars = json.dumps(entry.scalars)
        self._db.execute("INSERT INTO rounds VALUES (?, ?, ?)", (r, scalars, now))
        self._chain_note_round(r, scalars, entry.clients)
        self._db.executemany(
            "INSERT INTO clients (round, client_id, status, num_samples, norm, loss, reason, "
            "scalars) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    r,
                    c.client_id,
                    c.status,
                    c.num_samples,
                    to_real(c.norm),
                    to_real(c.loss),
                    c.reason,
                    json.dumps(dict(c.scalars)),
                )
                for c in entry.clients
            ],
        )

    def _check_attachable(self, round: int, updates: Mapping[int, torch.Tensor]) -> None:
        """Raise unless every update may be attached to committed ``round`` (in a transaction)."""
        if not self._db.execute("SELECT 1 FROM rounds WHERE round=?", (round,)).fetchone():
            raise HistoryError(
                f"{self._file}: cannot attach updates to round {round}: it is not committed. "
                "Nothing was written."
            )
        for cid in sorted(updates):
            row = self._db.execute(
                "SELECT status, EXISTS (SELECT 1 FROM payloads p WHERE p.round=? AND "
                "p.kind='update' AND p.client_id=?) FROM clients WHERE round=? AND client_id=?",
                (round, cid, round, cid),
            ).fetchone()
            if row is None or row[0] == UpdateStatus.MISSING.value:
                raise HistoryError(
                    f"{self._file}: cannot attach an update of client {cid} to round {round}: "
                    "the client has no reply recorded there. Nothing was written."
                )
            if row[1]:
                raise HistoryError(
                    f"{self._file}: round {round} already stores the update of client {cid}; "
                    "an attached update cannot replace it. Nothing was written."
                )

    def _insert_payload(self, round: int, kind: str, client_id: int, tensor: torch.Tensor) -> None:
        dtype, shape, data, keep_alive = encode(tensor)
        row = (None, round, kind, client_id, dtype, shape, data.nbytes, zlib.crc32(data), data)
        self._db.execute(
            "INSERT INTO payloads (id, round, kind, client_id, dtype, shape, size_bytes, crc32, "
            "data) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            row,
        )
        self._chain_note_payload(round, kind, client_id, data)
        if self._ledger:  # fingerprints of its overflow pages, kept after the payload goes
            self._db.execute(
                "INSERT OR REPLACE INTO payload_prints VALUES (?, ?, ?, ?, ?)",
                (round, kind, client_id, data.nbytes, prints_of(row, self._usable_page_size())),
            )
        if kind == "update" and self._has_stored_at:  # the client's row says it was kept
            self._db.execute(
                "UPDATE clients SET stored_at=? WHERE round=? AND client_id=?",
                (time.time(), round, client_id),
            )
        del keep_alive

    def truncate_after(self, round: int) -> None:
        """Drop every round after ``round`` in one transaction (to resume from ``round``).

        Args:
            round: Last round to keep; -1 drops every round, M_0 included.

        Raises:
            ConfigError: ``round`` is below -1.
            HistoryError: The store is read-only.
        """
        round = check_int(round, "truncate_after round", minimum=-1)
        self._require_writable(f"truncate after round {round}")
        tables = ("payloads", "payload_prints", "clients", "rounds")
        with self._transaction(f"dropping rounds after {round}"):
            for table in tables if self._ledger else tables[:1] + tables[2:]:
                self._db.execute(f"DELETE FROM {table} WHERE round > ?", (round,))
            self._chain_commit("truncate", drop_after=round)

    def _checkpoint_truncate(self, consequence: str) -> None:
        busy, _, _ = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            raise HistoryError(
                f"{self._file}: another process is reading the store, so its WAL cannot be "
                f"truncated; {consequence}."
            )

    # ----- reading ------------------------------------------------------------------------

    def rounds(self) -> list[int]:
        """Return the committed round numbers, ascending."""
        with self._sqlite("listing rounds"):
            return [r for (r,) in self._db.execute("SELECT round FROM rounds ORDER BY round")]

    def last_round(self) -> int | None:
        """Return the last committed round, or None if the store is empty."""
        with self._sqlite("reading the last round"):
            return self._db.execute("SELECT max(round) FROM rounds").fetchone()[0]

    def round_scalars(self, round: int) -> dict[str, Scalar]:
        """Return the metrics stored with ``round``.

        Raises:
            HistoryError: The round is not stored.
        """
        with self._sqlite(f"reading round {round}"):
            row = self._db.execute("SELECT scalars FROM rounds WHERE round=?", (round,)).fetchone()
        if row is None:
            raise self._missing_round(round)
        return json.loads(row[0])

    def client_records(self, round: int) -> list[ClientRecord]:
        """Return a record per client sampled in ``round``, by client id, ``stored`` filled in.

        Raises:
            HistoryError: The round is not stored.
        """
        self._require_round(round)
        with self._sqlite(f"reading round {round} clients"):
            rows = self._db.execute(
                "SELECT c.client_id, c.status, c.num_samples, c.norm, c.loss, c.reason, c.scalars,"
                " EXISTS (SELECT 1 FROM payloads p WHERE p.round=c.round AND p.kind='update'"
                " AND p.client_id=c.client_id) FROM clients c WHERE c.round=? ORDER BY c.client_id",
                (round,),
            ).fetchall()
        return [
            ClientRecord(
                cid,
                status,
                n,
                from_real(norm),
                from_real(loss),
                reason,
                json.loads(sc),
                bool(stored),
            )
            for cid, status, n, norm, loss, reason, sc, stored in rows
        ]

    def read_model(self, round: int, kind: str = "global") -> torch.Tensor:
        """Return a stored model tensor of ``round``.

        Args:
            round: Round number (0 is M_0).
            kind: ``"global"`` (M_round) or ``"aggregate"`` (the round's aggregated delta).

        Raises:
            ConfigError: Unknown ``kind``.
            HistoryError: Not stored.
            HistoryCorruptError: The payload fails its checksum.
        """
        if kind not in MODEL_KINDS:
            raise ConfigError(f"kind must be one of {', '.join(MODEL_KINDS)}; got {kind!r}.")
        row = self._payload_row("round=? AND kind=? AND client_id=?", (round, kind, NO_CLIENT))
        if row is None:
            self._require_round(round)
            dropped = self._dropped_at(round, kind)
            if dropped is not None:
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(dropped))
                raise DroppedModelError(
                    f"{self._file}: round {round} {kind} model was dropped by forget() at {when} "
                    "(with the updates still stored it would let a forgotten client's update be "
                    "rebuilt); a method that reads it cannot run on this history. Use retrain "
                    "or federaser (they read M_0 and the remaining clients' updates only)."
                )
            raise HistoryError(
                f"{self._file}: round {round} has no {kind} model stored (the history policy did "
                "not keep it). Use a round that has one, or rerun with a policy that keeps it."
            )
        return self._decode(row)

    def read_update(self, round: int, client_id: int) -> torch.Tensor:
        """Return the update delta ``client_id`` sent in ``round``.

        Raises:
            ForgottenDataError: It was deleted by ``forget()``.
            HistoryError: It was never stored.
            HistoryCorruptError: The payload fails its checksum.
        """
        row = self._payload_row("round=? AND kind='update' AND client_id=?", (round, client_id))
        if row is None:
            raise self._missing_update(round, client_id)
        return self._decode(row)

    def read_shard_model(self, round: int, shard: int) -> torch.Tensor:
        """Return shard ``shard``'s model after ``round`` (a sharded run; round 0: M_0).

        Raises:
            HistoryError: Not stored (not a sharded run, or not that round or shard).
            HistoryCorruptError: The payload fails its checksum.
        """
        if round == 0:
            return self.read_model(0)
        row = self._payload_row(
            "round=? AND kind='global' AND client_id=?",
            (round, shard_key(check_int(shard, "shard"))),
        )
        if row is None:
            self._require_round(round)
            raise HistoryError(
                f"{self._file}: round {round} has no model of shard {shard} (not a sharded run, "
                "or the shard does not exist)"
            )
        return self._decode(row)

    def stored_models(self) -> set[tuple[int, str]]:
        """Return ``(round, kind)`` of every stored global model and aggregate."""
        with self._sqlite("listing models"):
            return {
                (r, kind)
                for r, kind in self._db.execute(
                    "SELECT round, kind FROM payloads WHERE kind != 'update' AND client_id=?",
                    (NO_CLIENT,),
                )
            }

    def dropped_models(self) -> list[tuple[int, str]]:
        """Return ``(round, kind)`` of the models ``forget()`` dropped, by round."""
        if not self._ledger:
            return []
        with self._sqlite("reading the dropped models"):
            return [
                (r, k)
                for r, k in self._db.execute(
                    "SELECT DISTINCT round, kind FROM forget_models ORDER BY round, kind"
                )
            ]

    def _dropped_at(self, round: int, kind: str) -> float | None:
        if not self._ledger:
            return None
        with self._sqlite("reading the dropped models"):
            row = self._db.execute(
                "SELECT max(c.forgotten_at) FROM forget_models m JOIN forget_calls c ON "
                "c.id = m.call_id WHERE m.round=? AND m.kind=?",
                (round, kind),
            ).fetchone()
        return row[0] if row else None

    def has_update(self, round: int, client_id: int) -> bool:
        """Return whether the update of ``client_id`` in ``round`` is stored."""
        with self._sqlite(f"looking up round {round} client {client_id}"):
            return (
                self._db.execute(
                    "SELECT 1 FROM payloads WHERE round=? AND kind='update' AND client_id=?",
                    (round, client_id),
                ).fetchone()
                is not None
            )

    def iter_updates(self, round: int) -> Iterator[tuple[int, torch.Tensor]]:
        """Stream ``(client_id, update)`` of ``round`` by increasing id, one payload at a time.

        Only stored updates are yielded. The round is checked now; payloads are read lazily.

        Raises:
            HistoryError: The round is not stored.
            ForgottenDataError: A client is forgotten while iterating.
            HistoryCorruptError: A payload fails its checksum.
        """
        self._require_round(round)
        with self._sqlite(f"listing round {round} updates"):
            ids = [
                c
                for (c,) in self._db.execute(
                    "SELECT client_id FROM payloads WHERE round=? AND kind='update' "
                    "ORDER BY client_id",
                    (round,),
                )
            ]
        return ((cid, self.read_update(round, cid)) for cid in ids)

    def forget_records(self) -> list[ForgetRecord]:
        """Return the log of ``forget()`` calls, oldest first."""
        with self._sqlite("reading the forget log"):
            rows = self._db.execute(
                "SELECT client_id, forgotten_at, size_bytes, num_payloads FROM forget_log "
                "ORDER BY id"
            ).fetchall()
        return [ForgetRecord(*row) for row in rows]

    # ----- accounting and checks ----------------------------------------------------------

    def stored_bytes(self) -> int:
        """Return the exact sum of payload bytes (tensor data) currently stored."""
        return sum(self.stored_bytes_by_kind().values())

    def stored_bytes_by_kind(self) -> dict[str, int]:
        """Return payload bytes per kind: ``global``, ``aggregate`` and ``update``."""
        with self._sqlite("counting bytes"):
            rows = dict(
                self._db.execute(
                    "SELECT kind, sum(size_bytes) FROM payloads GROUP BY kind"
                ).fetchall()
            )
        return {kind: int(rows.get(kind, 0)) for kind in (*MODEL_KINDS, "update")}

    def stored_bytes_by_client(self) -> dict[int, int]:
        """Return update bytes per known client (0 for clients with none stored)."""
        with self._sqlite("counting bytes"):
            rows = self._db.execute(
                "SELECT k.client_id, coalesce((SELECT sum(size_bytes) FROM payloads p WHERE "
                "p.kind='update' AND p.client_id=k.client_id), 0) FROM (SELECT DISTINCT client_id "
                "FROM clients UNION SELECT client_id FROM forget_log) k ORDER BY k.client_id"
            ).fetchall()
        return dict(rows)

    def file_bytes(self) -> int:
        """Return the store's size on disk: the database file plus its WAL, if any."""
        wal = self._file.with_name(self._file.name + "-wal")
        return self._file.stat().st_size + (wal.stat().st_size if wal.exists() else 0)

    # ----- internals ----------------------------------------------------------------------

    @property
    def _db(self) -> sqlite3.Connection:
        if self._con is None:
            raise HistoryError(
                f"{self._file}: this store is closed; open it again with HistoryStore.open()."
            )
        return self._con

    @staticmethod
    def _meta_json(meta: object) -> str:
        if not isinstance(meta, Mapping):
            raise ConfigError(f"meta must be a dict; got {type(meta).__name__}.")
        try:
            return json.dumps(dict(meta), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"meta must be JSON-serialisable (no NaN): {exc}.") from exc

    @staticmethod
    def _own_lock(path: Path, lock: WriterLock | None) -> WriterLock:
        """Return ``lock`` (checked to be this directory's) or a freshly acquired one."""
        if lock is None:
            return WriterLock.acquire(path)
        if not lock.held or lock.path.resolve() != Path(path).resolve():
            lock.release()
            raise HistoryError(
                f"{path}: the writer lock handed in is not held for this directory "
                f"({lock.path}); take it with WriterLock.acquire({str(path)!r})."
            )
        return lock

    def _add_deletion_tables(self) -> None:
        """Add the deletion-record and event tables to a store written before they existed."""
        tables = {
            r for (r,) in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        if not _DELETION_TABLES <= tables:
            self._db.executescript("BEGIN IMMEDIATE;" + _DELETION_SCHEMA + "COMMIT;")
        if not _LEDGER_TABLES <= tables:
            last = self._db.execute("SELECT max(round) FROM rounds").fetchone()[0]
            self._db.executescript("BEGIN IMMEDIATE;" + _LEDGER_SCHEMA)
            self._db.execute(
                "INSERT OR REPLACE INTO info VALUES ('prints_from_round', ?)",
                (str(0 if last is None else last + 1),),
            )
            self._db.execute("COMMIT")
        columns = {r[1] for r in self._db.execute("PRAGMA table_info(clients)")}
        if "stored_at" not in columns:  # the clients' "update kept" marker, added the same way
            last = self._db.execute("SELECT max(round) FROM rounds").fetchone()[0]
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("ALTER TABLE clients ADD COLUMN stored_at REAL")
            self._db.execute(  # the updates stored now were kept when their round committed
                "UPDATE clients SET stored_at=(SELECT committed_at FROM rounds r WHERE "
                "r.round=clients.round) WHERE EXISTS (SELECT 1 FROM payloads p WHERE "
                "p.round=clients.round AND p.kind='update' AND p.client_id=clients.client_id)"
            )
            self._db.execute(
                "INSERT OR REPLACE INTO info VALUES ('stored_from_round', ?)",
                (str(0 if last is None else last + 1),),
            )
            self._db.execute("COMMIT")
            self._stored_at = True
        if not EVENT_TABLES <= tables:  # applied results (events.py), added the same way
            self._db.executescript("BEGIN IMMEDIATE;" + EVENT_SCHEMA + "COMMIT;")

    @property
    def _has_stored_at(self) -> bool:
        """Whether the clients' rows carry the "update kept" marker (``stored_at``)."""
        if self._stored_at is None:
            with self._sqlite("reading the schema"):
                columns = {r[1] for r in self._db.execute("PRAGMA table_info(clients)")}
            self._stored_at = "stored_at" in columns
        return self._stored_at

    @property
    def _ledger(self) -> bool:
        """Whether the store has the fingerprint ledger (``payload_prints``)."""
        if self._has_ledger is None:
            with self._sqlite("reading the schema"):
                self._has_ledger = (
                    self._db.execute(
                        "SELECT 1 FROM sqlite_master WHERE type='table' AND name='payload_prints'"
                    ).fetchone()
                    is not None
                )
        return self._has_ledger

    def _configure(self) -> None:
        con = self._db
        con.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
        con.execute("PRAGMA foreign_keys=ON")
        if self.writable:
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA synchronous=FULL")
            con.execute("PRAGMA secure_delete=ON")

    def _check_schema(self) -> None:
        tables = {
            r for (r,) in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        info = (
            dict(self._db.execute("SELECT key, value FROM info").fetchall())
            if "info" in tables
            else {}
        )
        if not _TABLES <= tables or info.get("format") != _FORMAT or "meta" not in info:
            missing = sorted(_TABLES - tables) or ["format marker"]
            raise HistoryCorruptError(
                f"{self._file}: a SQLite file but not a fedunlearn history store (missing "
                f"{', '.join(missing)}); nothing was changed. Point to the run directory that "
                "holds this run's history, or restore it from a backup."
            )
        version = info.get("schema_version")
        if version != str(SCHEMA_VERSION):
            raise HistoryError(
                f"{self._file}: history schema version {version}; this fedunlearn reads version "
                f"{SCHEMA_VERSION}. Use the fedunlearn version that wrote the run."
            )
        expected = _expected_columns()
        for table in sorted(tables & expected.keys()):
            columns = [row[1] for row in self._db.execute(f"PRAGMA table_info({table})")]
            older = [c for c in expected[table] if c not in _ADDED_COLUMNS.get(table, ())]
            if columns not in (expected[table], older):  # the schema page is damaged
                raise HistoryCorruptError(
                    f"{self._file}: the definition of table '{table}' is damaged (columns "
                    f"{columns[:6]}, expected {expected[table][:6]}); nothing was changed. "
                    "Restore the file from a backup, or start a new run."
                )

    def _require_writable(self, action: str) -> None:
        self._db  # noqa: B018 - raises if closed
        if not self.writable:
            raise HistoryError(
                f"{self._file}: opened read-only, cannot {action}. Open it with "
                "HistoryStore.open(path, writable=True)."
            )

    def _require_round(self, round: int) -> None:
        with self._sqlite(f"reading round {round}"):
            if self._db.execute("SELECT 1 FROM rounds WHERE round=?", (round,)).fetchone():
                return
        raise self._missing_round(round)

    def _missing_round(self, round: int) -> HistoryError:
        return HistoryError(
            f"{self._file}: round {round} is not stored (stored rounds: "
            f"{format_ids(self.rounds())}). Pick a stored round, or rerun with a history policy "
            "that keeps it."
        )

    def _missing_update(self, round: int, client_id: int) -> HistoryError:
        self._require_round(round)
        with self._sqlite(f"reading round {round} client {client_id}"):
            row = self._db.execute(
                "SELECT status, reason, forgotten_at FROM clients WHERE round=? AND client_id=?",
                (round, client_id),
            ).fetchone()
        if row is not None and row[2] is not None:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row[2]))
            return ForgottenDataError(
                f"{self._file}: round {round} client {client_id}: the update was deleted by "
                f"forget() at {when}; forgotten data cannot be read. Unlearning methods must work "
                "without it."
            )
        why = (
            "was not sampled"
            if row is None
            else f"is {row[0]}"
            + (f" ({row[1]})" if row[1] else "")
            + " and its update was not kept"
        )
        return HistoryError(
            f"{self._file}: round {round} has no update of client {client_id}: the client {why}. "
            "Use has_update() or client_records() to see what is stored."
        )

    def _payload_row(self, where: str, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        with self._sqlite("reading a payload"):
            return self._db.execute(
                "SELECT round, kind, client_id, dtype, shape, size_bytes, crc32, data "
                f"FROM payloads WHERE {where}",
                args,
            ).fetchone()

    def _decode(self, row: tuple[Any, ...] | None) -> torch.Tensor:
        if row is None:  # deleted between listing and reading
            raise HistoryError(f"{self._file}: a payload vanished while reading; retry.")
        round, kind, cid, dtype_name, shape_json, size, crc, data = row
        try:
            return decode(dtype_name, shape_json, size, crc, data)
        except PayloadError as err:
            raise HistoryCorruptError(
                f"{self._file}: round {round} {self._what(kind, cid)} {err}; nothing was "
                f"changed. {self._repair_advice(round)}"
            ) from None

    @staticmethod
    def _what(kind: str, client_id: int) -> str:
        return f"client {client_id}" if kind == "update" else f"{kind} model"

    @contextmanager
    def _transaction(self, action: str) -> Iterator[None]:
        with self._sqlite(action):
            self._db.execute("BEGIN IMMEDIATE")
            self._chain_reset()
            try:
                yield
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    @contextmanager
    def _sqlite(self, action: str) -> Iterator[None]:
        """Translate SQLite errors into HistoryError / HistoryCorruptError naming the file."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            code = getattr(exc, "sqlite_errorcode", None)
            # without a SQLite code the error is the sqlite3 module's own reading of a value:
            # a plain DatabaseError, or text that is not UTF-8 (a damaged page): damage too
            corrupt = (
                code is None
                and (type(exc) is sqlite3.DatabaseError or "decode to UTF-8" in str(exc))
            ) or (code is not None and (code & 0xFF in _CORRUPT_CODES or code == _SHORT_READ))
            if corrupt:
                raise HistoryCorruptError(
                    f"{self._file}: SQLite reports '{exc}' while {action}: the file is damaged or "
                    "truncated; nothing was changed. Restore it from a backup, or start a new run."
                ) from exc
            raise HistoryError(
                f"{self._file}: SQLite error while {action}: {exc} "
                f"({getattr(exc, 'sqlite_errorname', type(exc).__name__)}); nothing was changed. "
                "Check disk space and permissions, and that no other program writes the file."
            ) from exc
