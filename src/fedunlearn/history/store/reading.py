"""Reading a store: ``HistoryStore``'s methods that list, read and count what it holds.

``Reading`` holds the reads of rounds, client records, models and updates (each payload checked
against its CRC-32), the byte counts and the errors that say why something cannot be read
(never stored, forgotten, dropped by ``forget()``). It is mixed into ``HistoryStore``
(``sqlite``) and uses its declared host (``host.py``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import torch

from fedunlearn.errors import (
    ConfigError,
    ForgottenDataError,
    HistoryCorruptError,
    HistoryError,
    UnsupportedHistoryError,
)
from fedunlearn.history.store.codec import NO_CLIENT, PayloadError, decode, from_real, shard_key
from fedunlearn.history.store.host import StoreMixin
from fedunlearn.history.store.records import (
    ClientRecord,
    ForgetRecord,
    Scalar,
    check_int,
    format_ids,
)
from fedunlearn.history.store.schema import MODEL_KINDS

__all__ = ["DroppedModelError", "Reading", "as_read"]


def as_read(update: torch.Tensor) -> torch.Tensor:
    """An update of a float16 store as ``read_update`` returns it: a float16 payload as float32.

    The recorder takes its records of the stored copy through this, so they are of what a
    reader reads.
    """
    return update.to(torch.float32) if update.dtype == torch.float16 else update


class DroppedModelError(ForgottenDataError, UnsupportedHistoryError):
    """A global model or aggregate ``forget()`` dropped was asked for.

    Both a ``ForgottenDataError`` (the data is gone on purpose) and an
    ``UnsupportedHistoryError`` (a method that needs it cannot serve the request: the error
    every method raises for a history that lacks what it reads).
    """


class Reading(StoreMixin):
    """``HistoryStore``'s reading methods (a mixin: see the module docstring)."""

    def rounds(self) -> list[int]:
        """Return the committed round numbers, ascending."""
        with self._sqlite("listing rounds"):
            return [r for (r,) in self._db.execute("SELECT round FROM rounds ORDER BY round")]

    def last_round(self) -> int | None:
        """Return the last committed round, or None if the store is empty."""
        with self._sqlite("reading the last round"):
            last: int | None = self._db.execute("SELECT max(round) FROM rounds").fetchone()[0]
        return last

    def round_scalars(self, round: int) -> dict[str, Scalar]:
        """Return the metrics stored with ``round``.

        Raises:
            HistoryError: The round is not stored.
        """
        with self._sqlite(f"reading round {round}"):
            row = self._db.execute("SELECT scalars FROM rounds WHERE round=?", (round,)).fetchone()
        if row is None:
            raise self._missing_round(round)
        scalars: dict[str, Scalar] = json.loads(row[0])
        return scalars

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

        A run that stores its updates in float16 (``history.encoding``) reads them as float32.

        Raises:
            ForgottenDataError: It was deleted by ``forget()``.
            HistoryError: It was never stored.
            HistoryCorruptError: The payload fails its checksum.
        """
        return self.read_sized_update(round, client_id)[0]

    def read_sized_update(self, round: int, client_id: int) -> tuple[torch.Tensor, int]:
        """Return ``read_update``'s tensor and the bytes its payload takes as stored.

        A float16 payload reads as float32 but takes 2 bytes a value; an update a float16 run
        kept in float32 (a value beyond 65,504) takes 4. Raises as ``read_update``.
        """
        row = self._payload_row("round=? AND kind='update' AND client_id=?", (round, client_id))
        if row is None:
            raise self._missing_update(round, client_id)
        update = self._decode(row)
        size = update.numel() * update.element_size()
        if self._encodes_updates_in_half():
            return as_read(update), size  # computed with as float32, the models' dtype
        return update, size

    def _encodes_updates_in_half(self) -> bool:
        """Whether the run stores its updates in float16 (``RunMeta.half_updates``; read once)."""
        half: bool | None = getattr(self, "_half_updates", None)
        if half is None:
            half = self.run_meta.half_updates
            self._half_updates = half
        return half

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
        return ((cid, update) for cid, update, _ in self.iter_sized_updates(round))

    def iter_sized_updates(self, round: int) -> Iterator[tuple[int, torch.Tensor, int]]:
        """``iter_updates`` with each payload's bytes as stored (``read_sized_update``)."""
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
        return ((cid, *self.read_sized_update(round, cid)) for cid in ids)

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
            row: tuple[Any, ...] | None = self._db.execute(
                "SELECT round, kind, client_id, dtype, shape, size_bytes, crc32, data "
                f"FROM payloads WHERE {where}",
                args,
            ).fetchone()
        return row

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
