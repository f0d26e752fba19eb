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

import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedunlearn.errors import ConfigError, HistoryCorruptError, HistoryError
from fedunlearn.fl.closing import Closing
from fedunlearn.history.digest import canonical_sha256
from fedunlearn.history.store.audit import DeletionAudit
from fedunlearn.history.store.chain import CHAIN_INFO_KEY, Chain
from fedunlearn.history.store.damage import check_header, sqlite_errors, wal_damage
from fedunlearn.history.store.erasure import Erasure
from fedunlearn.history.store.events import Generations
from fedunlearn.history.store.integrity import Integrity
from fedunlearn.history.store.lock import WriterLock, own_lock
from fedunlearn.history.store.metadata import RunMeta, parse_run_meta
from fedunlearn.history.store.reading import DroppedModelError, Reading
from fedunlearn.history.store.schema import (
    BUSY_TIMEOUT_MS,
    FILE_NAME,
    FORMAT,
    LOCK_NAME,
    META_SHA256_KEY,
    PAGE_SIZE,
    SCHEMA_VERSION,
    add_missing_tables,
    check_schema,
    full_schema,
    table_names,
)
from fedunlearn.history.store.writing import Writing

__all__ = [
    "FILE_NAME",
    "LOCK_NAME",
    "SCHEMA_VERSION",
    "DroppedModelError",
    "HistoryStore",
    "WriterLock",
]


class HistoryStore(
    Writing, Reading, Erasure, DeletionAudit, Integrity, Generations, Chain, Closing
):
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
        lock = own_lock(path, lock)
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
                con.execute(f"PRAGMA page_size={PAGE_SIZE}")  # before WAL, which fixes it
                con.execute("PRAGMA auto_vacuum=INCREMENTAL")  # before the first table
                store._configure()
                info = {
                    "format": FORMAT,
                    "schema_version": str(SCHEMA_VERSION),
                    "meta": meta_json,
                    META_SHA256_KEY: canonical_sha256(json.loads(meta_json)),
                }
                # executescript leaves the transaction open
                con.executescript("BEGIN IMMEDIATE;" + full_schema())
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
        lock = own_lock(Path(path), lock) if writable else None
        try:
            check_header(file)
            mode = "rw" if writable else "ro"
            con = sqlite3.connect(
                f"{file.resolve().as_uri()}?mode={mode}", uri=True, isolation_level=None
            )
            store = cls(con, file, lock)
            with store._sqlite("opening the store"):
                store._configure()
                check_schema(con, file)  # its reads recover the WAL: the wal-index is current
                damage = wal_damage(file)
                if damage is not None:
                    raise HistoryCorruptError(damage)
                if writable:
                    if add_missing_tables(con):
                        store._stored_at = True
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

    @property
    def run_meta(self) -> RunMeta:
        """The metadata as its typed record (``metadata.py``): every known key typed.

        Raises:
            HistoryCorruptError: The metadata is missing or damaged, or a known key holds a
                value of the wrong type (the message names the key).
        """
        return parse_run_meta(self.meta, str(self._file))

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
        """The recording policy the run used (``history_policy``; "unknown" if unset)."""
        return self.run_meta.history_policy or "unknown"

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
            self._has_ledger = self._has_tables({"payload_prints"})
        return self._has_ledger

    def _has_tables(self, names: Iterable[str]) -> bool:
        """Whether the store has every table of ``names`` (a store written before one lacks it)."""
        with self._sqlite("reading the schema"):
            return set(names) <= table_names(self._db)

    def _configure(self) -> None:
        con = self._db
        con.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        con.execute("PRAGMA foreign_keys=ON")
        if self.writable:
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA synchronous=FULL")
            con.execute("PRAGMA secure_delete=ON")

    def _require_writable(self, action: str) -> None:
        self._db  # noqa: B018 - raises if closed
        if not self.writable:
            raise HistoryError(
                f"{self._file}: opened read-only, cannot {action}. Open it with "
                "HistoryStore.open(path, writable=True)."
            )

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
        """Translate SQLite errors into HistoryError / HistoryCorruptError (``damage.py``)."""
        with sqlite_errors(self._file, action):
            yield
