"""The committed history: every change to a store as one link of a SHA-256 hash chain.

``Chain`` holds the ``HistoryStore`` methods of the chain (docs/verification.md, "Committed
history"). Every transaction that changes what the store holds appends one link to the ``chain``
table, inside the same transaction (all or nothing with the change it commits):

- ``round`` (``write_round``): the round number, the SHA-256 of the round's scalars, its
  participants ``[client, status, samples, reason]`` (the policy's decisions: accepted, rejected,
  missing) and every payload it stored ``[round, kind, client, sha256]`` (global model,
  aggregate, shard models, updates; updates of earlier rounds a deferred policy attaches carry
  their own round);
- ``forget`` (``forget()``): the clients and every payload it deleted, with the SHA-256 the
  deletion record keeps (``removed``);
- ``apply`` (``apply()``): the event (method, forget set, model and result SHA-256), the rounds it
  drops (``drop_after``), the forgotten clients' payloads it deletes (``removed``) and the rounds
  and payloads it writes;
- ``truncate`` (``truncate_after``, a resume): the rounds it drops.

A link is ``sha256(canonical_json(body))`` where the body holds ``prev``, the previous link
(``GENESIS_PREV`` for the first, the ``genesis`` link ``create`` writes): the last link, the
*head*, commits to every link before it. ``check_chain`` walks the links, replays them into the
state they commit to (rounds, participants, payload hashes, deletion records, events) and
compares it with the store: a payload deleted outside ``forget()`` (raw SQL), whatever was
removed with it (its client rows, its ledger row), is committed but gone; an edited payload
differs from its hash; a deletion record that lost a row, or one never committed, differs from
the ``removed`` lists. ``forget()`` does not break the chain: its link commits what it removed.

What it does not prove: whoever can write the file can rewrite the whole chain consistently;
the chain then differs from any head handed out before (a receipt's ``run.chain``, a signed
head: ``fedunlearn.runs.chain_signing``), which is what an auditor compares. A store written
before the chain existed has no ``chain`` table and says so (``ChainCheck.present`` False); it
never gets one.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fedunlearn.history.digest import canonical_json
from fedunlearn.history.store.codec import NO_CLIENT
from fedunlearn.history.store.host import StoreMixin

__all__ = ["CHAIN_SCHEMA", "CHAIN_TABLE", "GENESIS_PREV", "Chain", "ChainCheck", "ChainHead"]

CHAIN_TABLE = "chain"
CHAIN_SCHEMA = """
CREATE TABLE chain (
    seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, body TEXT NOT NULL, link TEXT NOT NULL);
"""
#: ``info`` key a store written with a chain carries (its chain table gone is damage).
CHAIN_INFO_KEY = "chain"
#: ``prev`` of the first link.
GENESIS_PREV = "0" * 64
_SAMPLE = 20  # problems listed


@dataclass(frozen=True)
class ChainHead:
    """The last link of a store's chain: what a receipt names and a signature covers.

    Attributes:
        seq: Its position (1 is the genesis link).
        link: Its SHA-256 (hex), which commits to every link before it.
    """

    seq: int
    link: str

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"seq", "head"}`` (the form a receipt's ``run.chain`` holds)."""
        return {"seq": self.seq, "head": self.link}


@dataclass(frozen=True)
class ChainCheck:
    """What ``check_chain`` found.

    Attributes:
        present: The store has a chain (False: written before it existed).
        ok: The chain is whole and the store holds exactly what it commits to.
        links: Links read.
        head: The last link, or None (no chain, or none readable).
        payloads_hashed: Payloads whose SHA-256 was compared with the committed one.
        problems: ``(round or None, line)`` per problem, first found first.
    """

    present: bool
    ok: bool
    links: int = 0
    head: ChainHead | None = None
    payloads_hashed: int = 0
    problems: tuple[tuple[int | None, str], ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {
            "present": self.present,
            "ok": self.ok,
            "links": self.links,
            "head": None if self.head is None else self.head.to_dict(),
            "payloads_hashed": self.payloads_hashed,
            "problems": [line for _, line in self.problems],
        }


def _label(kind: str, client_id: int) -> str:
    if kind == "update":
        return f"client {client_id}"
    if kind == "global" and client_id < NO_CLIENT:
        return f"shard {-2 - client_id} model"
    return f"{kind} model"


def _link_of(body: dict[str, Any]) -> tuple[str, str]:
    text = canonical_json(body).decode("utf-8")
    return text, hashlib.sha256(text.encode("utf-8")).hexdigest()


class _Replay:
    """The state the links commit to, rebuilt link by link."""

    def __init__(self) -> None:
        self.rounds: dict[int, dict[str, Any]] = {}
        self.live: dict[tuple[int, str, int], str] = {}
        self.removed: set[tuple[int, str, int, str]] = set()
        self.events: list[dict[str, Any]] = []
        self.problems: list[tuple[int | None, str]] = []

    def add(self, seq: int, doc: dict[str, Any]) -> None:
        for r, kind, cid, sha in doc.get("removed", []):
            if self.live.pop((r, kind, cid), None) != sha:
                self.problems.append(
                    (
                        r,
                        f"link {seq} removes round {r} {_label(kind, cid)}, which the links "
                        "before it do not hold with that SHA-256",
                    )
                )
            self.removed.add((r, kind, cid, sha))
        if "drop_after" in doc:
            last = int(doc["drop_after"])
            self.rounds = {r: v for r, v in self.rounds.items() if r <= last}
            self.live = {k: v for k, v in self.live.items() if k[0] <= last}
        for r, info in doc.get("rounds", {}).items():
            self.rounds[int(r)] = info
        for r, kind, cid, sha in doc.get("payloads", []):
            self.live[(r, kind, cid)] = sha
        if doc.get("event") is not None:
            self.events.append(doc["event"])


class Chain(StoreMixin):
    """``HistoryStore``'s chain methods (a mixin: see the module docstring)."""

    _chain_pending: dict[str, Any] | None = None
    _has_chain: bool | None = None

    # ----- writing (inside the caller's transaction) ---------------------------------------

    @property
    def _chained(self) -> bool:
        """Whether this store keeps a chain (written since the chain existed)."""
        if self._has_chain is None:
            self._has_chain = self._has_tables({CHAIN_TABLE})
        return self._has_chain

    def _chain_reset(self) -> None:
        """Start collecting what the transaction now beginning changes."""
        self._chain_pending = {"rounds": {}, "payloads": [], "removed": []}

    def _chain_note_round(self, round: int, scalars_text: str, clients: Iterable[Any]) -> None:
        if self._chain_pending is None:
            return
        self._chain_pending["rounds"][str(round)] = {
            "scalars": hashlib.sha256(scalars_text.encode("utf-8")).hexdigest(),
            "clients": [[c.client_id, c.status, c.num_samples, c.reason] for c in clients],
        }

    def _chain_note_payload(self, round: int, kind: str, client_id: int, data: Any) -> None:
        if self._chain_pending is not None and self._chained:
            sha = hashlib.sha256(data).hexdigest()
            self._chain_pending["payloads"].append([round, kind, client_id, sha])

    def _chain_note_removed(self, round: int, kind: str, client_id: int, sha: str) -> None:
        if self._chain_pending is not None:
            self._chain_pending["removed"].append([round, kind, client_id, sha])

    def _chain_commit(self, kind: str, **fields: Any) -> None:
        """Append the link of what this transaction changed (no-op for a store without one)."""
        pending, self._chain_pending = self._chain_pending or {}, None
        if not self._chained:
            return
        row = self._db.execute(
            f"SELECT seq, link FROM {CHAIN_TABLE} ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        seq, prev = (row[0] + 1, row[1]) if row else (1, GENESIS_PREV)
        body: dict[str, Any] = {"kind": kind, "prev": prev}
        body.update({k: v for k, v in pending.items() if v})
        body.update(fields)
        text, link = _link_of(body)
        self._db.execute(
            f"INSERT INTO {CHAIN_TABLE} (seq, kind, body, link) VALUES (?, ?, ?, ?)",
            (seq, kind, text, link),
        )

    # ----- reading ----------------------------------------------------------------------------

    def chain_head(self) -> ChainHead | None:
        """Return the chain's last link, or None (a store written before the chain)."""
        if not self._chained:
            return None
        with self._sqlite("reading the chain head"):
            row = self._db.execute(
                f"SELECT seq, link FROM {CHAIN_TABLE} ORDER BY seq DESC LIMIT 1"
            ).fetchone()
        return None if row is None else ChainHead(int(row[0]), str(row[1]))

    def chain_link(self, seq: int) -> str | None:
        """Return the link at position ``seq`` (None: no such link, or no chain)."""
        if not self._chained:
            return None
        with self._sqlite("reading the chain"):
            row = self._db.execute(
                f"SELECT link FROM {CHAIN_TABLE} WHERE seq=?", (int(seq),)
            ).fetchone()
        return None if row is None else str(row[0])

    def chain_links(self) -> list[tuple[int, str, dict[str, Any], str]]:
        """Return every link as ``(seq, kind, body, link)``, oldest first ([] without a chain)."""
        if not self._chained:
            return []
        with self._sqlite("reading the chain"):
            rows = self._db.execute(
                f"SELECT seq, kind, body, link FROM {CHAIN_TABLE} ORDER BY seq"
            ).fetchall()
        out = []
        for seq, kind, body, link in rows:
            try:
                doc = json.loads(body)
            except (TypeError, ValueError):
                doc = {}
            out.append((int(seq), str(kind), doc if isinstance(doc, dict) else {}, str(link)))
        return out

    def check_chain(self, *, full: bool = True) -> ChainCheck:
        """Walk the chain and compare the store with what it commits to; change nothing.

        Args:
            full: Hash every payload; False hashes the models and checks that every committed
                update is present (not its bytes).

        Returns:
            The check; ``present`` False (and ``ok`` True) for a store without a chain.
        """
        if not self._chained:
            with self._sqlite("reading the chain marker"):
                marked = self._db.execute(
                    "SELECT 1 FROM info WHERE key=?", (CHAIN_INFO_KEY,)
                ).fetchone()
            if marked:
                gone = "the chain table is gone: the committed history was removed"
                return ChainCheck(present=False, ok=False, problems=((None, gone),))
            return ChainCheck(present=False, ok=True)
        replay = _Replay()
        with self._sqlite("reading the chain"):
            rows = self._db.execute(
                f"SELECT seq, kind, body, link FROM {CHAIN_TABLE} ORDER BY seq"
            ).fetchall()
        prev, head = GENESIS_PREV, None
        for expected, (seq, kind, body, link) in enumerate(rows, start=1):
            why = self._link_problem(expected, seq, kind, body, link, prev)
            if why is not None:
                replay.problems.append((None, why))
                break
            replay.add(seq, json.loads(body))
            prev, head = link, ChainHead(seq, link)
        if not rows:
            replay.problems.append((None, "the chain has no link (its genesis link is gone)"))
        hashed = self._compare_with_store(replay, full=full)
        problems = tuple(replay.problems[:_SAMPLE])
        if len(replay.problems) > _SAMPLE:
            problems += ((None, f"... and {len(replay.problems) - _SAMPLE} more"),)
        return ChainCheck(
            present=True,
            ok=not replay.problems,
            links=len(rows),
            head=head,
            payloads_hashed=hashed,
            problems=problems,
        )

    @staticmethod
    def _link_problem(
        expected: int, seq: int, kind: str, body: str, link: str, prev: str
    ) -> str | None:
        if seq != expected:
            return f"link {expected} is missing (the chain goes on at link {seq}): links were cut"
        if not isinstance(body, str) or hashlib.sha256(body.encode("utf-8")).hexdigest() != link:
            return f"link {seq} ({kind}) does not match its SHA-256: it was edited"
        try:
            doc = json.loads(body)
        except ValueError:
            return f"link {seq} is not JSON"
        if not isinstance(doc, dict) or doc.get("prev") != prev or doc.get("kind") != kind:
            return f"link {seq} does not follow link {seq - 1}: links were cut or replaced"
        return None

    def _compare_with_store(self, replay: _Replay, *, full: bool) -> int:
        """Add a problem per difference between the committed state and the store."""
        problems = replay.problems
        with self._sqlite("comparing the store with its chain"):
            stored = dict(self._db.execute("SELECT round, scalars FROM rounds").fetchall())
            clients: dict[int, list[list[Any]]] = {}
            for r, cid, status, n, reason in self._db.execute(
                "SELECT round, client_id, status, num_samples, reason FROM clients "
                "ORDER BY round, client_id"
            ):
                clients.setdefault(r, []).append([cid, status, n, reason])
        for r in sorted(set(replay.rounds) | set(stored)):
            committed = replay.rounds.get(r)
            if committed is None:
                problems.append((r, f"round {r}: stored but not in the committed history"))
                continue
            if r not in stored:
                held = sum(1 for k in replay.live if k[0] == r)
                problems.append(
                    (
                        r,
                        f"round {r}: committed, but its rows and {held} payload(s) are gone "
                        "with no deletion record (removed outside forget)",
                    )
                )
                continue
            if hashlib.sha256(str(stored[r]).encode("utf-8")).hexdigest() != committed["scalars"]:
                problems.append((r, f"round {r}: its scalars differ from the committed ones"))
            if sorted(clients.get(r, [])) != sorted(committed["clients"]):
                problems.append(
                    (
                        r,
                        f"round {r}: its participants or their statuses differ from the "
                        "committed ones (rows changed or removed outside forget)",
                    )
                )
        hashed = self._compare_payloads(replay, set(stored), full=full)
        self._compare_records(replay)
        return hashed

    def _compare_payloads(self, replay: _Replay, stored_rounds: set[int], *, full: bool) -> int:
        problems = replay.problems
        seen: set[tuple[int, str, int]] = set()
        hashed = 0
        with self._sqlite("hashing the payloads"):
            listing = self._db.execute(
                "SELECT id, round, kind, client_id FROM payloads ORDER BY round, kind, client_id"
            ).fetchall()
            for pid, r, kind, cid in listing:
                key = (r, kind, cid)
                seen.add(key)
                committed = replay.live.get(key)
                if committed is None:
                    problems.append(
                        (
                            r,
                            f"round {r} {_label(kind, cid)}: stored but not in the committed "
                            "history",
                        )
                    )
                    continue
                if not full and kind == "update":
                    continue
                row = self._db.execute(
                    "SELECT crc32, data FROM payloads WHERE id=?", (pid,)
                ).fetchone()
                data = row[1] if row is not None and isinstance(row[1], bytes) else None
                if data is None or zlib.crc32(data) != row[0]:
                    continue  # damaged: check() reports it by its checksum
                hashed += 1
                if hashlib.sha256(data).hexdigest() != committed:
                    problems.append(
                        (
                            r,
                            f"round {r} {_label(kind, cid)}: its bytes differ from the committed "
                            "SHA-256 (replaced after it was written)",
                        )
                    )
        for r, kind, cid in sorted(set(replay.live) - seen):
            if r in stored_rounds:
                problems.append(
                    (
                        r,
                        f"round {r} {_label(kind, cid)}: committed, but gone with no deletion "
                        "record (removed outside forget)",
                    )
                )
        return hashed

    def _compare_records(self, replay: _Replay) -> None:
        """The deletion records and events against the ``removed`` lists and ``event``s."""
        problems = replay.problems
        with self._sqlite("reading the deletion records"):
            records = {
                (r, "update", cid, sha)
                for r, cid, sha in self._db.execute(
                    "SELECT round, client_id, sha256 FROM forget_payloads"
                )
            }
            records |= {
                (r, kind, NO_CLIENT, sha)
                for r, kind, sha in self._db.execute(
                    "SELECT round, kind, sha256 FROM forget_models"
                )
            }
        for r, kind, cid, _ in sorted(replay.removed - records):
            problems.append(
                (None, f"the deletion record of round {r} {_label(kind, cid)} is gone or changed")
            )
        for r, kind, cid, _ in sorted(records - replay.removed):
            problems.append(
                (
                    None,
                    f"a deletion record of round {r} {_label(kind, cid)} is not in the "
                    "committed history (added outside forget)",
                )
            )
        stored = [_event_fields(e.to_dict()) for e in self.events()]
        committed = [_event_fields(e) for e in replay.events]
        if stored != committed:
            problems.append(
                (
                    None,
                    f"the applied events ({len(stored)}) differ from the committed ones "
                    f"({len(committed)})",
                )
            )


#: An applied event's fields, as the chain commits them (the events table's columns, in order).
EVENT_FIELDS = (
    "kind",
    "forget",
    "new",
    "method",
    "request_kind",
    "result_sha256",
    "receipt_sha256",
    "model_sha256",
    "rounds_before",
    "rounds_after",
)


def _event_fields(event: dict[str, Any]) -> dict[str, Any]:
    return {k: event.get(k) for k in EVENT_FIELDS}
