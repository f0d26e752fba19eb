"""Writing rounds: ``HistoryStore``'s methods that add or drop whole rounds.

``Writing`` holds ``write_round`` (one transaction per round, with the deferred updates of
earlier rounds), the row and payload inserts that ``apply()`` (``events``) reuses, and
``truncate_after``. It is mixed into ``HistoryStore`` (``sqlite``) and uses its declared host
(``host.py``). Why each step: the ``sqlite`` module docstring.
"""

from __future__ import annotations

import json
import sqlite3
import time
import zlib
from collections.abc import Mapping

import torch

from fedunlearn.errors import ConfigError, HistoryError
from fedunlearn.fl.records import UpdateStatus
from fedunlearn.history.store.codec import NO_CLIENT, encode, shard_key, to_real
from fedunlearn.history.store.deletion import prints_of
from fedunlearn.history.store.host import StoreMixin
from fedunlearn.history.store.records import RoundEntry, check_int, check_tensor, format_ids

__all__ = ["Writing"]


class Writing(StoreMixin):
    """``HistoryStore``'s round-writing methods (a mixin: see the module docstring)."""

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
        payloads = self._payloads_of(entry, late)
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

    def _payloads_of(
        self, entry: RoundEntry, late: dict[int, dict[int, torch.Tensor]]
    ) -> list[tuple[int, str, int, torch.Tensor]]:
        """``(round, kind, client, tensor)`` of every payload a round writes, size-checked.

        Raises:
            ConfigError: A payload is larger than SQLite's BLOB limit (nothing was written).
        """
        r = entry.round
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
        return payloads

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
