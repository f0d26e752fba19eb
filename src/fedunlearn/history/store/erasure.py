"""Forgetting clients' stored updates.

``Erasure`` holds the ``HistoryStore`` methods that delete: ``forget()`` (secure delete of the
updates and of the models that would rebuild them, chosen by ``reconstruction``; the deletion
record; the space given back by ``incremental_vacuum`` or a full ``VACUUM``). It is mixed into
``HistoryStore`` (``sqlite``) and uses its declared host (``host.py``); the records and checks
of what was deleted are ``audit``'s, the evidence itself (record values, page fingerprints, the
page scan) is in ``deletion``. Why each step: the ``sqlite`` module docstring.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Iterable
from typing import Literal, cast

from fedunlearn.errors import (
    ConfigError,
    HistoryError,
    UnknownClientError,
)
from fedunlearn.history.store.codec import NO_CLIENT
from fedunlearn.history.store.deletion import (
    DeletionRecord,
    prints_of,
)
from fedunlearn.history.store.host import StoreMixin
from fedunlearn.history.store.reconstruction import models_to_drop
from fedunlearn.history.store.records import check_int, format_ids

__all__ = ["Erasure"]


_AUTO_VACUUM_INCREMENTAL = 2  # PRAGMA auto_vacuum value
#: The scalars of a client record ``forget()`` keeps: participation facts (how many of the
#: round's draws it won, whether the record is a method's estimate), not values of its update.
KEPT_CLIENT_SCALARS = frozenset({"multiplicity", "estimated"})


class Erasure(StoreMixin):
    """``HistoryStore``'s deleting methods (a mixin: see the module docstring)."""

    _usable: int | None  # the file's usable page size, read once (``_usable_page_size``)

    def forget(
        self, client_ids: Iterable[int], *, vacuum: Literal["incremental", "full"] = "incremental"
    ) -> DeletionRecord:
        """Delete every stored update of ``client_ids`` from the file, and record it.

        Steps, in order: check the ids (nothing changes if one is unknown); make sure no reader
        pins old WAL frames; read each payload once for its SHA-256 and page fingerprints; in one
        transaction delete the payloads (``secure_delete`` zeroes the freed pages), mark the
        clients' records, append to the forget log and the deletion record, and give the freed
        pages back (``incremental_vacuum``); truncate the WAL to zero bytes. In the same
        transaction it drops the aggregates of every round a forgotten client was aggregated
        in and the global models between its first and last such round (never M_0 or the last
        model): with the other clients' updates they would let each deleted update be rebuilt
        (``reconstruction.py``); they are recorded in the deletion record (``models``) and in
        the metadata (``dropped_models``), and reading one raises ``DroppedModelError``.
        It also drops every per-round value of the clients' records (``norm``, ``loss``,
        ``<Δ_c, G_t>``: ``_drop_update_scalars``), keeping who took part.
        Removing the clients' influence from the last model is the unlearning method's job.

        Args:
            client_ids: Clients to forget; ids forgotten before are accepted (0 bytes).
            vacuum: ``"incremental"`` (default: time and extra disk proportional to the
                forgotten bytes) or ``"full"`` (``VACUUM``: rebuilds the whole file, needs its
                size again in free disk). A store written before auto_vacuum was enabled always
                gets ``"full"`` once, which converts it.

        Returns:
            The deletion record of this call (also kept in the store; see
            ``deletion_records()``). Forgetting nobody returns an empty record that is not kept.

        Raises:
            ConfigError: ``vacuum`` is not one of the two modes.
            UnknownClientError: An id never appears in the store; nothing was changed.
            HistoryError: The store is read-only, or another process is reading and keeps the
                WAL from being truncated (the message says what was done).
        """
        self._require_writable("forget clients")
        if vacuum not in ("incremental", "full"):
            raise ConfigError(f"vacuum must be 'incremental' or 'full'; got {vacuum!r}.")
        ids = sorted({check_int(c, "forget client id") for c in client_ids})
        before = self.file_bytes()
        if not ids:
            return DeletionRecord(0, time.time(), (), (), 0, before, before, vacuum)
        with self._sqlite("forgetting clients"):
            self._require_known(ids)
            self._checkpoint_truncate("nothing was changed; close the other readers and retry")
            before = self.file_bytes()
            incremental = (
                vacuum == "incremental"
                and self._db.execute("PRAGMA auto_vacuum").fetchone()[0] == _AUTO_VACUUM_INCREMENTAL
            )
            usable = self._usable_page_size()
            with self._transaction("forgetting clients"):
                call = self._delete_clients(ids, before, incremental, usable)
                if incremental:
                    self._incremental_vacuum()
            if not incremental:
                self._full_vacuum(ids)
            self._checkpoint_truncate(
                f"the updates of clients {format_ids(ids)} are deleted and their pages given "
                "back, but old WAL frames may still hold copies; call forget() with the same ids "
                "again once the other readers have closed"
            )
            after = self.file_bytes()
            with self._transaction("recording the file size after forgetting"):
                self._db.execute(
                    "UPDATE forget_calls SET file_bytes_after=? WHERE id=?", (after, call)
                )
            self._checkpoint_truncate("the deletion is complete; only its record is in the WAL")
        return self._deletion_record(call)

    def _require_known(self, ids: list[int]) -> None:
        """Raise UnknownClientError unless every id appears in the store (nothing changes)."""
        known = {
            row[0]
            for row in self._db.execute(
                "SELECT DISTINCT client_id FROM clients UNION SELECT client_id FROM forget_log"
            )
        }
        unknown = [c for c in ids if c not in known]
        if unknown:
            raise UnknownClientError(
                f"{self._file}: client(s) {format_ids(unknown)} never appear in this history "
                f"(known client ids: {format_ids(known)}); nothing was forgotten."
            )

    def _delete_clients(self, ids: list[int], before: int, incremental: bool, usable: int) -> int:
        """Delete the clients' updates and the models that rebuild them (in the transaction).

        Returns:
            The id of the call's deletion record (``forget_calls``).
        """
        evidence = [self._evidence(pid, usable) for pid in self._payload_ids(ids)]
        logged = {c for (c,) in self._db.execute("SELECT client_id FROM forget_log")}
        dropped = [
            self._model_evidence(round, kind, usable)
            for round, kind in models_to_drop(self, set(ids) | logged)
        ]
        now = time.time()
        call = cast(  # an INSERT's lastrowid is the new row's id (None only without one)
            int,
            self._db.execute(
                "INSERT INTO forget_calls (forgotten_at, client_ids, size_bytes, "
                "file_bytes_before, vacuum, page_size) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    now,
                    json.dumps(ids),
                    sum(e[2] for e in evidence),
                    before,
                    "incremental" if incremental else "full",
                    usable,
                ),
            ).lastrowid,
        )
        self._db.executemany(
            "INSERT INTO forget_payloads VALUES (?, ?, ?, ?, ?, ?)", [(call, *e) for e in evidence]
        )
        self._drop_models(call, dropped)
        # the ledger rows of what went are in forget_payloads / forget_models now
        self._db.executemany(
            "DELETE FROM payload_prints WHERE round=? AND kind=? AND client_id=?",
            [(e[0], "update", e[1]) for e in evidence] + [(m[0], m[1], NO_CLIENT) for m in dropped],
        )
        self._drop_update_scalars(ids)
        for cid in ids:
            mine = [e for e in evidence if e[1] == cid]
            self._db.execute(
                "UPDATE clients SET forgotten_at=? WHERE client_id=? AND round IN "
                "(SELECT round FROM payloads WHERE kind='update' AND client_id=?)",
                (now, cid, cid),
            )
            self._db.execute("DELETE FROM payloads WHERE kind='update' AND client_id=?", (cid,))
            self._db.execute(
                "INSERT INTO forget_log (client_id, forgotten_at, size_bytes, num_payloads)"
                " VALUES (?, ?, ?, ?)",
                (cid, now, sum(e[2] for e in mine), len(mine)),
            )
        for e in evidence:  # the link commits what went (chain.py)
            self._chain_note_removed(e[0], "update", e[1], e[3])
        for m in dropped:
            self._chain_note_removed(m[0], m[1], NO_CLIENT, m[3])
        self._chain_commit("forget", clients=ids)
        return call

    def _drop_models(self, call: int, dropped: list[tuple[int, str, int, str, bytes]]) -> None:
        """Record and delete the models that would rebuild a deleted update (in the transaction).

        In the metadata too (``dropped_models``): every reader (a method's view) sees it.
        """
        self._db.executemany(
            "INSERT INTO forget_models VALUES (?, ?, ?, ?, ?, ?)", [(call, *m) for m in dropped]
        )
        self._db.executemany(
            "DELETE FROM payloads WHERE round=? AND kind=? AND client_id=?",
            [(m[0], m[1], NO_CLIENT) for m in dropped],
        )
        if dropped:
            gone = set(self.run_meta.dropped_models) | {(m[0], m[1]) for m in dropped}
            self._put_meta(self.meta | {"dropped_models": [list(m) for m in sorted(gone)]})

    def _drop_update_scalars(self, client_ids: list[int]) -> None:
        """Drop every per-round value of the forgotten clients' records (in the transaction).

        Their ``norm`` and ``loss`` and every scalar but the participation facts
        (``KEPT_CLIENT_SCALARS``): ``<Δ_c, G_t>`` with the kept models rebuilds a deleted
        update (issue 33), and the loss, noise-free, singles a client out (issue 40). The
        status and the sample count stay: who took part, and how FedAvg weighed it.
        """
        marks = ",".join("?" * len(client_ids))
        rows = self._db.execute(
            f"SELECT round, client_id, scalars FROM clients WHERE client_id IN ({marks})",
            tuple(client_ids),
        ).fetchall()
        updates = []
        for round, cid, text in rows:
            kept = {k: v for k, v in json.loads(text).items() if k in KEPT_CLIENT_SCALARS}
            updates.append((json.dumps(kept), round, cid))
        self._db.executemany(
            "UPDATE clients SET norm=NULL, loss=NULL, scalars=? WHERE round=? AND client_id=?",
            updates,
        )

    def _payload_ids(self, client_ids: list[int]) -> list[int]:
        marks = ",".join("?" * len(client_ids))
        rows = self._db.execute(
            f"SELECT id FROM payloads WHERE kind='update' AND client_id IN ({marks}) "
            "ORDER BY client_id, round",
            tuple(client_ids),
        )
        return [pid for (pid,) in rows]

    def _evidence(self, payload_id: int, usable: int) -> tuple[int, int, int, str, bytes]:
        """Return (round, client, size, SHA-256, fingerprints) of a payload about to go."""
        row = self._db.execute(
            "SELECT NULL, round, kind, client_id, dtype, shape, size_bytes, crc32, data "
            "FROM payloads WHERE id=?",
            (payload_id,),
        ).fetchone()
        data = row[-1] if isinstance(row[-1], bytes) else b""
        return row[1], row[3], row[6], hashlib.sha256(data).hexdigest(), prints_of(row, usable)

    def _model_evidence(
        self, round: int, kind: str, usable: int
    ) -> tuple[int, str, int, str, bytes]:
        """Return (round, kind, size, SHA-256, fingerprints) of a model about to be dropped."""
        row = self._db.execute(
            "SELECT NULL, round, kind, client_id, dtype, shape, size_bytes, crc32, data "
            "FROM payloads WHERE round=? AND kind=? AND client_id=?",
            (round, kind, NO_CLIENT),
        ).fetchone()
        data = row[-1] if isinstance(row[-1], bytes) else b""
        return round, kind, row[6], hashlib.sha256(data).hexdigest(), prints_of(row, usable)

    def _usable_page_size(self) -> int:
        if self._usable is None:
            page_size = self._db.execute("PRAGMA page_size").fetchone()[0]
            with self._file.open("rb") as fh:
                fh.seek(20)
                reserved = fh.read(1)
            self._usable = page_size - (reserved[0] if reserved else 0)
        return self._usable

    def _incremental_vacuum(self) -> None:
        """Give every free page back to the file system (inside the current transaction)."""
        # Each step of the pragma frees one page, and sqlite3's execute() steps once.
        free = self._db.execute("PRAGMA freelist_count").fetchone()[0]
        while free:
            for _ in range(free):
                self._db.execute("PRAGMA incremental_vacuum")
            free = self._db.execute("PRAGMA freelist_count").fetchone()[0]

    def _full_vacuum(self, ids: list[int]) -> None:
        try:
            self._db.execute("PRAGMA auto_vacuum=INCREMENTAL")  # VACUUM converts the file
            self._db.execute("VACUUM")
        except sqlite3.DatabaseError as exc:
            raise HistoryError(
                f"{self._file}: the updates of clients {format_ids(ids)} are deleted, their "
                f"pages zeroed, but VACUUM failed ({exc}), so the file did not shrink. Free "
                "disk space (VACUUM needs about twice the file size) and call forget() with "
                "the same ids again."
            ) from exc
