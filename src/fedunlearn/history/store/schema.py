"""The SQL schema of a history store, and the checks and upgrades of an opened file's schema.

Composed into ``HistoryStore`` (``sqlite``) as plain functions of a connection: ``check_schema``
on every open, ``add_missing_tables`` on a writable open of a store written before a table or
column existed (it gets them then, and reads as having none of their rows until then).
"""

from __future__ import annotations

import functools
import sqlite3
from pathlib import Path

from fedunlearn.errors import HistoryCorruptError, HistoryError
from fedunlearn.history.store.chain import CHAIN_SCHEMA
from fedunlearn.history.store.events import EVENT_SCHEMA, EVENT_TABLES

__all__ = [
    "BUSY_TIMEOUT_MS",
    "DELETION_TABLES",
    "FILE_NAME",
    "FORMAT",
    "LOCK_NAME",
    "META_SHA256_KEY",
    "MODEL_KINDS",
    "PAGE_SIZE",
    "SCHEMA",
    "SCHEMA_VERSION",
    "add_missing_tables",
    "check_schema",
    "full_schema",
    "table_names",
]

SCHEMA_VERSION = 1
FILE_NAME = "history.sqlite"
LOCK_NAME = "history.lock"
MODEL_KINDS = ("global", "aggregate")
FORMAT = "fedunlearn-history"
PAGE_SIZE = 16384  # fewer overflow pages per multi-MB blob than 4096; see benchmarks/
BUSY_TIMEOUT_MS = 10_000
SCHEMA = """
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
TABLES = frozenset({"info", "rounds", "clients", "payloads", "forget_log"})
#: ``info`` key of the metadata's checksum (``HistoryStore.meta_problem``).
META_SHA256_KEY = "meta_sha256"
DELETION_TABLES = frozenset({"forget_calls", "forget_payloads"})
_LEDGER_TABLES = frozenset({"payload_prints", "forget_models"})

# columns a writable open adds to a store written before them (``add_missing_tables``): a
# store without them is old, not damaged
_ADDED_COLUMNS: dict[str, tuple[str, ...]] = {"clients": ("stored_at",)}


@functools.cache
def _expected_columns() -> dict[str, list[str]]:
    """The column names of every table a store of this schema version has (built in memory)."""
    con = sqlite3.connect(":memory:")
    try:
        con.executescript(full_schema())
        tables = [r for (r,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: [row[1] for row in con.execute(f"PRAGMA table_info({t})")] for t in tables}
    finally:
        con.close()


def full_schema() -> str:
    """Every table and index of a store of this schema version, as one SQL script."""
    return SCHEMA + _DELETION_SCHEMA + _LEDGER_SCHEMA + EVENT_SCHEMA + CHAIN_SCHEMA


def table_names(con: sqlite3.Connection) -> set[str]:
    """Return the names of the tables ``con``'s store has."""
    return {r for (r,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def check_schema(con: sqlite3.Connection, file: Path) -> None:
    """Raise unless ``con`` holds a fedunlearn history store of this schema version.

    Raises:
        HistoryCorruptError: Not a store (tables or format marker missing), or a table's
            definition is damaged.
        HistoryError: The store was written by another schema version.
    """
    tables = table_names(con)
    info = dict(con.execute("SELECT key, value FROM info").fetchall()) if "info" in tables else {}
    if not TABLES <= tables or info.get("format") != FORMAT or "meta" not in info:
        missing = sorted(TABLES - tables) or ["format marker"]
        raise HistoryCorruptError(
            f"{file}: a SQLite file but not a fedunlearn history store (missing "
            f"{', '.join(missing)}); nothing was changed. Point to the run directory that "
            "holds this run's history, or restore it from a backup."
        )
    version = info.get("schema_version")
    if version != str(SCHEMA_VERSION):
        raise HistoryError(
            f"{file}: history schema version {version}; this fedunlearn reads version "
            f"{SCHEMA_VERSION}. Use the fedunlearn version that wrote the run."
        )
    expected = _expected_columns()
    for table in sorted(tables & expected.keys()):
        columns = [row[1] for row in con.execute(f"PRAGMA table_info({table})")]
        older = [c for c in expected[table] if c not in _ADDED_COLUMNS.get(table, ())]
        if columns not in (expected[table], older):  # the schema page is damaged
            raise HistoryCorruptError(
                f"{file}: the definition of table '{table}' is damaged (columns "
                f"{columns[:6]}, expected {expected[table][:6]}); nothing was changed. "
                "Restore the file from a backup, or start a new run."
            )


def add_missing_tables(con: sqlite3.Connection) -> bool:
    """Add the deletion-record, ledger and event tables to a store written before them.

    Returns:
        Whether the clients' ``stored_at`` column was added now.
    """
    tables = table_names(con)
    if not DELETION_TABLES <= tables:
        con.executescript("BEGIN IMMEDIATE;" + _DELETION_SCHEMA + "COMMIT;")
    if not _LEDGER_TABLES <= tables:
        last = con.execute("SELECT max(round) FROM rounds").fetchone()[0]
        con.executescript("BEGIN IMMEDIATE;" + _LEDGER_SCHEMA)
        con.execute(
            "INSERT OR REPLACE INTO info VALUES ('prints_from_round', ?)",
            (str(0 if last is None else last + 1),),
        )
        con.execute("COMMIT")
    added = False
    columns = {r[1] for r in con.execute("PRAGMA table_info(clients)")}
    if "stored_at" not in columns:  # the clients' "update kept" marker, added the same way
        last = con.execute("SELECT max(round) FROM rounds").fetchone()[0]
        con.execute("BEGIN IMMEDIATE")
        con.execute("ALTER TABLE clients ADD COLUMN stored_at REAL")
        con.execute(  # the updates stored now were kept when their round committed
            "UPDATE clients SET stored_at=(SELECT committed_at FROM rounds r WHERE "
            "r.round=clients.round) WHERE EXISTS (SELECT 1 FROM payloads p WHERE "
            "p.round=clients.round AND p.kind='update' AND p.client_id=clients.client_id)"
        )
        con.execute(
            "INSERT OR REPLACE INTO info VALUES ('stored_from_round', ?)",
            (str(0 if last is None else last + 1),),
        )
        con.execute("COMMIT")
        added = True
    if not EVENT_TABLES <= tables:  # applied results (events.py), added the same way
        con.executescript("BEGIN IMMEDIATE;" + EVENT_SCHEMA + "COMMIT;")
    return added
