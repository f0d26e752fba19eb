"""Applied unlearning results: the store's events table and the one transaction that applies one.

``Generations`` holds the ``HistoryStore`` methods of a living federation (docs/lifecycle.md).
An *event* is one applied unlearning result; event ``g`` starts generation ``g`` (the run's
training is generation 0). ``apply()`` commits, in ONE transaction, the event row and either

- **a trajectory** (``fedunlearn.history.trajectory.Trajectory``): the run's rounds 1..T are
  replaced by the trajectory's rounds 1..L (round 0, M_0, stays). The original rounds' payloads
  go (``secure_delete`` zeroes their pages): their aggregates and global models carry the
  forgotten clients' influence and, with the other updates, would let a deleted update be
  rebuilt (``reconstruction.py``). The forgotten clients' own updates among them are recorded
  like a ``forget()`` call (a deletion record with SHA-256 and page fingerprints, and the forget
  log), so ``check_deletions()`` covers them; a later ``forget()`` of those clients deletes
  nothing more. The history is then one generation without the forgotten clients:
  ``clean_from_round()`` is 0;
- **or a model only** (a method that computes no trajectory, or a model from elsewhere): one
  round T+1 is appended whose global model is the applied model (no aggregate, no client).
  Rounds 1..T still carry the forgotten clients' influence, so ``clean_from_round()`` is T+1 and
  a method reading them refuses (``fedunlearn.unlearn.session``); ``forget()`` still deletes the
  forgotten clients' stored updates.

``forgotten_clients()`` is the union of every event's clients and every ``forget()``-ed client:
a later request forgets them too, and continued training never asks them. A crash at any
instant leaves the store before or after the whole apply (SQLite's atomic commit).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch

from fedunlearn.errors import ConfigError, HistoryError
from fedunlearn.history.store.chain import EVENT_FIELDS
from fedunlearn.history.store.codec import NO_CLIENT, shard_key
from fedunlearn.history.store.host import StoreMixin
from fedunlearn.history.store.records import RoundEntry, format_ids

__all__ = ["EVENT_SCHEMA", "EVENT_TABLES", "AppliedEvent", "Generations"]

EVENT_SCHEMA = """
CREATE TABLE events (
    id INTEGER PRIMARY KEY, applied_at REAL NOT NULL, kind TEXT NOT NULL
    CHECK (kind IN ('trajectory', 'model')), forget TEXT NOT NULL, new TEXT NOT NULL,
    method TEXT NOT NULL, request_kind TEXT NOT NULL, result_sha256 TEXT NOT NULL,
    receipt_sha256 TEXT NOT NULL, model_sha256 TEXT NOT NULL, rounds_before INTEGER NOT NULL,
    rounds_after INTEGER NOT NULL, clean_from_round INTEGER NOT NULL,
    dropped_payloads INTEGER NOT NULL, dropped_bytes INTEGER NOT NULL);
"""
EVENT_TABLES = frozenset({"events"})
APPLIED_KEY = "applied_event"  # round scalar of the round a model-only apply appends
FORGOTTEN_SAMPLES_KEY = "forgotten_samples"  # meta: client -> sample ids applied results deleted


@dataclass(frozen=True)
class AppliedEvent:
    """One applied unlearning result (a row of the events table).

    Attributes:
        generation: The generation the event starts (1 for the first).
        applied_at: Unix time of the commit.
        kind: ``trajectory`` (rounds replaced) or ``model`` (one round appended).
        forget: The request's full forget set (new and earlier clients).
        new: The clients this request added.
        method: The method that computed the result.
        request_kind: ``forget`` or ``recover``.
        result_sha256: SHA-256 of the result JSON file ("" when applied from memory).
        receipt_sha256: SHA-256 of the receipt (canonical JSON; "" if unverified).
        model_sha256: SHA-256 of the applied model's float32 bytes.
        rounds_before: The run's last round before the event.
        rounds_after: The run's last round after it.
        clean_from_round: First round (after M_0) without any forgotten client's influence.
        dropped_payloads: Payloads the event deleted.
        dropped_bytes: Their bytes.
    """

    generation: int
    applied_at: float
    kind: str
    forget: tuple[int, ...]
    new: tuple[int, ...]
    method: str
    request_kind: str
    result_sha256: str
    receipt_sha256: str
    model_sha256: str
    rounds_before: int
    rounds_after: int
    clean_from_round: int
    dropped_payloads: int
    dropped_bytes: int

    def to_dict(self) -> dict[str, Any]:
        """Return the event as a JSON-ready dict."""
        out = asdict(self)
        out["forget"], out["new"] = list(self.forget), list(self.new)
        return out


def _request_ids(
    forget: Iterable[int], new: Iterable[int], samples: Mapping[int, Iterable[int]] | None
) -> tuple[list[int], list[int], dict[int, list[int]]]:
    """The sorted forget set, new clients and client -> deleted sample ids of a request."""
    forget_ids = sorted({int(c) for c in forget})
    deleted = {int(c): sorted({int(i) for i in ids}) for c, ids in (samples or {}).items()}
    if not forget_ids and not any(deleted.values()):
        raise ConfigError("an applied result must forget at least one client or sample")
    return forget_ids, sorted({int(c) for c in new}), deleted


def _check_trajectory(rounds: list[RoundEntry], forget_ids: list[int], kept: int) -> None:
    """Raise ConfigError unless the rounds are kept+1..L in order, none with a forgotten client."""
    for expected, entry in enumerate(rounds, start=kept + 1):
        if entry.round != expected:
            raise ConfigError(
                f"trajectory rounds must be 1..L in order; round {expected} is "
                f"numbered {entry.round}; nothing was changed"
            )
        clients = {c.client_id for c in entry.clients} | set(entry.updates)
        taken = sorted(clients & set(forget_ids))
        if taken:
            raise ConfigError(
                f"trajectory round {expected} includes forgotten client(s) "
                f"{format_ids(taken)}; nothing was changed"
            )
    if not rounds and not kept:
        raise ConfigError("a trajectory needs at least one round; nothing was changed")


class Generations(StoreMixin):
    """``HistoryStore``'s event methods (a mixin: see the module docstring)."""

    def events(self) -> list[AppliedEvent]:
        """Return every applied event, oldest first (none for a store without the table)."""
        if not self._has_tables(EVENT_TABLES):
            return []
        with self._sqlite("reading the events"):
            rows = self._db.execute(
                "SELECT id, applied_at, kind, forget, new, method, request_kind, result_sha256, "
                "receipt_sha256, model_sha256, rounds_before, rounds_after, clean_from_round, "
                "dropped_payloads, dropped_bytes FROM events ORDER BY id"
            ).fetchall()
        return [
            AppliedEvent(
                row[0],
                row[1],
                row[2],
                tuple(json.loads(row[3])),
                tuple(json.loads(row[4])),
                *row[5:],
            )
            for row in rows
        ]

    def generation(self) -> int:
        """Return the current generation (the number of applied events)."""
        return len(self.events())

    def applied_clients(self) -> frozenset[int]:
        """Return every client an applied event removed (its influence left the run's model)."""
        return frozenset(c for e in self.events() for c in e.forget)

    def forgotten_clients(self) -> frozenset[int]:
        """Return every client an applied event or a ``forget()`` removed."""
        out = {c for e in self.events() for c in e.forget}
        out |= {e.client_id for e in self.forget_records()}
        return frozenset(out)

    def forgotten_samples(self) -> dict[int, frozenset[int]]:
        """Return client -> the sample ids applied results deleted (sample-level requests)."""
        stored = self.run_meta.forgotten_samples
        return {int(c): frozenset(ids) for c, ids in stored.items()}

    def clean_from_round(self) -> int:
        """Return the first round after which no stored round carries a forgotten influence.

        0 when nothing was applied or the last event replaced the rounds with a trajectory
        (every stored round is then free of them); the round a model-only apply appended
        otherwise (the rounds before it carry the earlier clients' influence).
        """
        events = self.events()
        return events[-1].clean_from_round if events else 0

    def apply(
        self,
        *,
        forget: Iterable[int],
        new: Iterable[int],
        method: str,
        request_kind: str,
        model: torch.Tensor,
        model_sha256: str,
        trajectory: Iterable[RoundEntry] | None = None,
        result_sha256: str = "",
        receipt_sha256: str = "",
        expected_last_round: int | None = None,
        scalars: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
        kept: int = 0,
        samples: Mapping[int, Iterable[int]] | None = None,
    ) -> AppliedEvent:
        """Make an unlearned model the run's current model, in one transaction.

        Args:
            forget: The request's full forget set (new and earlier clients).
            new: The part of ``forget`` this request added.
            method: The method that computed the result.
            request_kind: ``forget`` or ``recover``.
            model: The applied model (the trajectory's last global model when there is one).
            model_sha256: Its digest, as the result file names it.
            trajectory: Rounds 1..L replacing the run's rounds 1..T, or None (model only).
            result_sha256: Digest of the result file the event comes from.
            receipt_sha256: Digest of the result's receipt.
            expected_last_round: Refuse unless the store's last round is this one (the round
                the result was computed on); None skips the check.
            scalars: Metrics stored with the appended round of a model-only apply.
            meta: Entries merged into the store's metadata in the same transaction (the
                privacy ledger of a DP run: ``fedunlearn.runs.rundir.PRIVACY_LINEAGE_KEY``).
            kept: The trajectory keeps the run's rounds 1..kept as they are (an exact replay's
                untouched prefix) and replaces rounds kept+1..T by its own, numbered from
                kept+1. No forgotten client may appear in the kept rounds.
            samples: Client -> sample ids the result deleted (a sample-level request); merged
                into ``forgotten_samples()``, so later requests and continued training work on
                the data without them.

        Returns:
            The event.

        Raises:
            HistoryError: Read-only store, no round 0, or the last round is not
                ``expected_last_round``; nothing was changed.
            ConfigError: A trajectory round includes a forgotten client, or the rounds are
                not 1..L; nothing was changed.
        """
        self._require_writable("apply an unlearning result")
        forget_ids, new_ids, deleted = _request_ids(forget, new, samples)
        rounds = list(trajectory) if trajectory is not None else None
        if rounds is not None:
            _check_trajectory(rounds, forget_ids, kept)
        self._checkpoint_truncate("nothing was changed; close the other readers and retry")
        before_bytes = self.file_bytes()
        usable = self._usable_page_size()
        with self._transaction("applying an unlearning result"):
            last = self._last_round_for(expected_last_round)
            now = time.time()
            if rounds is not None:
                dropped = self._replace_rounds(rounds, forget_ids, now, usable, before_bytes, kept)
                after, clean = kept + len(rounds), 0
            else:
                dropped, after, clean = (0, 0), last + 1, last + 1
                self._append_model(after, model, scalars, now)
            event = {
                "kind": "trajectory" if rounds is not None else "model",
                "forget": forget_ids,
                "new": new_ids,
                "method": method,
                "request_kind": request_kind,
                "result_sha256": result_sha256,
                "receipt_sha256": receipt_sha256,
                "model_sha256": model_sha256,
                "rounds_before": last,
                "rounds_after": after,
            }
            event_id = self._insert_event(event, now, clean, *dropped)
            self._put_applied_meta(dict(meta or {}), deleted, after, clean, rounds is not None)
            if rounds is not None:  # the link commits the event and what changed (chain.py)
                self._chain_commit("apply", event=event, drop_after=kept)
                self._incremental_vacuum()
            else:
                self._chain_commit("apply", event=event)
        self._checkpoint_truncate("the result is applied; old WAL frames may hold copies")
        if rounds is not None:
            self._record_size_after()
        return next(e for e in self.events() if e.generation == event_id)

    def _record_size_after(self) -> None:
        """Record the file's size in the deletion record a trajectory's apply wrote."""
        with self._transaction("recording the file size after applying"):
            self._db.execute(
                "UPDATE forget_calls SET file_bytes_after=? WHERE id=(SELECT max(id) FROM "
                "forget_calls)",
                (self.file_bytes(),),
            )
        self._checkpoint_truncate("the result is applied; only its record is in the WAL")

    def _last_round_for(self, expected: int | None) -> int:
        """The store's last round, checked against the one a result was computed on."""
        last = self._db.execute("SELECT max(round) FROM rounds").fetchone()[0]
        if last is None:
            raise HistoryError(f"{self._file}: no round 0 to apply a result to")
        if expected is not None and last != expected:
            raise HistoryError(
                f"{self._file}: the result was computed on round {expected} and "
                f"the run is at round {last} now (trained on or applied since); nothing "
                "was changed. Unlearn again on the run as it is."
            )
        return int(last)

    def _append_model(
        self, round: int, model: torch.Tensor, scalars: Mapping[str, Any] | None, now: float
    ) -> None:
        """Append a model-only result as round ``round`` (in the transaction)."""
        generation = self._db.execute("SELECT count(*) FROM events").fetchone()[0] + 1
        text = json.dumps({**dict(scalars or {}), APPLIED_KEY: generation})
        self._db.execute("INSERT INTO rounds VALUES (?, ?, ?)", (round, text, now))
        self._chain_note_round(round, text, ())
        self._insert_payload(round, "global", NO_CLIENT, model.detach().cpu())

    def _insert_event(
        self, event: dict[str, Any], now: float, clean: int, dropped: int, dropped_bytes: int
    ) -> int | None:
        """Insert the event's row (in the transaction); return its id."""
        cursor = self._db.execute(
            "INSERT INTO events (applied_at, kind, forget, new, method, request_kind, "
            "result_sha256, receipt_sha256, model_sha256, rounds_before, rounds_after, "
            "clean_from_round, dropped_payloads, dropped_bytes) VALUES "
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                now,
                event["kind"],
                json.dumps(event["forget"]),
                json.dumps(event["new"]),
                *(event[k] for k in EVENT_FIELDS[3:]),  # method .. rounds_after, as they are
                clean,
                dropped,
                dropped_bytes,
            ),
        )
        return cursor.lastrowid

    def _put_applied_meta(
        self,
        extra: dict[str, Any],
        deleted: dict[int, list[int]],
        after: int,
        clean: int,
        replaced: bool,
    ) -> None:
        """Write the metadata an applied result changes (in the transaction).

        ``extra`` merged in; the deleted samples; the new round target and the first clean
        round (every method's view of the history sees them); the dropped models go with the
        rounds a trajectory replaced; a continuation in progress ends.
        """
        meta = self.meta | extra
        if any(deleted.values()):
            merged = {c: set(ids) for c, ids in self.forgotten_samples().items()}
            for c, ids in deleted.items():
                merged.setdefault(c, set()).update(ids)
            meta[FORGOTTEN_SAMPLES_KEY] = {str(c): sorted(v) for c, v in sorted(merged.items())}
        meta["rounds_target"] = after
        meta["clean_from_round"] = clean
        if replaced:  # the models forget() dropped are gone with their rounds
            meta.pop("dropped_models", None)
        meta.pop("continuation", None)
        self._put_meta(meta)

    def _replace_rounds(
        self,
        rounds: list[RoundEntry],
        forget_ids: list[int],
        now: float,
        usable: int,
        before_bytes: int,
        kept: int = 0,
    ) -> tuple[int, int]:
        """Drop rounds kept+1..T and insert ``rounds`` (inside the apply's transaction).

        The forgotten clients' updates among the dropped payloads get a deletion record and a
        forget-log entry (as ``forget()`` would give them); the other payloads' ledger rows go
        with them (they were replaced, not deleted behind the record's back).

        Raises:
            ConfigError: A forgotten client has a record in a kept round (the trajectory cannot
                keep it); the caller's transaction rolls back.
        """
        if kept and forget_ids:
            marks = ",".join("?" * len(forget_ids))
            clash = self._db.execute(
                f"SELECT round, client_id FROM clients WHERE round BETWEEN 1 AND ? AND "
                f"client_id IN ({marks}) LIMIT 1",
                (kept, *forget_ids),
            ).fetchone()
            if clash:
                raise ConfigError(
                    f"the trajectory keeps rounds 1..{kept}, but client {clash[1]} took part in "
                    f"round {clash[0]}; nothing was changed"
                )
        count, total = self._db.execute(
            "SELECT count(*), coalesce(sum(size_bytes), 0) FROM payloads WHERE round > ?",
            (kept,),
        ).fetchone()
        evidence = [self._evidence(pid, usable) for pid in self._payload_ids(forget_ids)]
        evidence = [e for e in evidence if e[0] > 0]
        call = self._db.execute(
            "INSERT INTO forget_calls (forgotten_at, client_ids, size_bytes, file_bytes_before, "
            "vacuum, page_size) VALUES (?, ?, ?, ?, ?, ?)",
            (
                now,
                json.dumps(forget_ids),
                sum(e[2] for e in evidence),
                before_bytes,
                "incremental",
                usable,
            ),
        ).lastrowid
        self._db.executemany(
            "INSERT INTO forget_payloads VALUES (?, ?, ?, ?, ?, ?)", [(call, *e) for e in evidence]
        )
        for e in evidence:
            self._chain_note_removed(e[0], "update", e[1], e[3])
        logged = {c for (c,) in self._db.execute("SELECT DISTINCT client_id FROM forget_log")}
        for cid in forget_ids:
            mine = [e for e in evidence if e[1] == cid]
            if mine or cid not in logged:
                self._db.execute(
                    "INSERT INTO forget_log (client_id, forgotten_at, size_bytes, num_payloads) "
                    "VALUES (?, ?, ?, ?)",
                    (cid, now, sum(e[2] for e in mine), len(mine)),
                )
        for table in ("payloads", "payload_prints", "clients", "rounds"):
            self._db.execute(f"DELETE FROM {table} WHERE round > ?", (kept,))
        for entry in rounds:
            self._insert_round(entry, now)
        return int(count), int(total)

    def _insert_round(self, entry: RoundEntry, now: float) -> None:
        """Insert one round's rows and payloads (inside the caller's transaction)."""
        r = entry.round
        self._insert_round_rows(entry, now)
        if entry.global_model is not None:
            self._insert_payload(r, "global", NO_CLIENT, entry.global_model.detach().cpu())
        if entry.aggregate is not None:
            self._insert_payload(r, "aggregate", NO_CLIENT, entry.aggregate.detach().cpu())
        for shard in sorted(entry.shard_models):
            self._insert_payload(
                r, "global", shard_key(shard), entry.shard_models[shard].detach().cpu()
            )
        for cid in sorted(entry.updates):
            self._insert_payload(r, "update", cid, entry.updates[cid].detach().cpu())
