"""Showing that deletions held: ``HistoryStore``'s deletion records, evidence and checks.

``DeletionAudit`` holds ``deletion_records()``, ``deletion_evidence()`` and
``check_deletions()``: each payload ``forget()`` deleted (``erasure``) must be unreadable and no
page of it left in the files, and the catalogue must show no payload gone without a record. It
is mixed into ``HistoryStore`` (``sqlite``) and uses its declared host (``host.py``); the
evidence itself (record values, page fingerprints, the page scan) is in ``deletion``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Any

from fedunlearn.errors import ForgottenDataError, HistoryCorruptError, HistoryError
from fedunlearn.history.store.codec import NO_CLIENT
from fedunlearn.history.store.deletion import (
    FINGERPRINT_BYTES,
    DeletedPayload,
    DeletionCheck,
    DeletionRecord,
    DroppedModel,
    anchor_prints,
    scan_pages,
    split_fingerprints,
)
from fedunlearn.history.store.evidence import DeletionEvidence
from fedunlearn.history.store.host import StoreMixin
from fedunlearn.history.store.reconstruction import reconstructible_updates
from fedunlearn.history.store.records import check_int
from fedunlearn.history.store.schema import DELETION_TABLES

__all__ = ["REBUILDING_SCALARS", "DeletionAudit"]


def _record_dict(record: Any) -> dict[str, Any]:
    """A deletion record as a JSON-ready dict (``to_dict`` or its fields)."""
    to_dict = getattr(record, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    return dataclasses.asdict(record)


def _record_clients(record: dict[str, Any]) -> set[int]:
    if "client_ids" in record:
        return {int(c) for c in record["client_ids"]}
    return {int(record["client_id"])} if "client_id" in record else set()


# per-client scalars that, with the kept models, rebuild a deleted update (``history.policy``'s
# DOT_AGGREGATE_KEY: <Δ_c, G_t>); the store check reports a forgotten row that still holds one
REBUILDING_SCALARS = frozenset({"dot_aggregate"})


class DeletionAudit(StoreMixin):
    """``HistoryStore``'s deletion records and checks (a mixin: see the module docstring)."""

    def deletion_evidence(self, client_ids: Iterable[int]) -> DeletionEvidence:
        """Return what the store shows about ``client_ids``' update payloads (``evidence.py``).

        Reads the bytes still held, the deletion records about them, every round one of them
        took part in whose update is not stored (a read must be refused), the page scan and
        the catalogue's account (``check_deletions``) and the updates still rebuildable.
        """
        clients = sorted({check_int(c, "client id") for c in client_ids})
        by_client = self.stored_bytes_by_client()
        wanted = set(clients)
        records = [
            r
            for r in (_record_dict(x) for x in self.forget_records())
            if _record_clients(r) & wanted
        ]
        held = 0
        read_back: dict[str, Any] = {"attempted": 0, "refused": 0, "not_stored": 0, "readable": []}
        for round_ in self.rounds():
            for rec in self.client_records(round_) if round_ else ():
                if rec.client_id not in wanted:
                    continue
                if rec.stored:
                    held += 1
                    continue
                read_back["attempted"] += 1
                try:
                    self.read_update(round_, rec.client_id)
                except ForgottenDataError:
                    read_back["refused"] += 1
                except HistoryError:
                    read_back["not_stored"] += 1
                else:
                    read_back["readable"].append([round_, rec.client_id])
        return DeletionEvidence(
            clients=tuple(clients),
            bytes_held={c: int(by_client.get(c, 0)) for c in clients},
            payloads_held=held,
            records=tuple(records),
            read_back=read_back,
            check=self.check_deletions(clients),
            reconstructible=tuple(tuple(p) for p in reconstructible_updates(self, clients)),
        )

    def deletion_records(self, client_ids: Iterable[int] | None = None) -> list[DeletionRecord]:
        """Return the deletion record of every ``forget()`` call, oldest first.

        Args:
            client_ids: Only calls that forgot one of these clients, each with only these
                clients' payloads; None for all.
        """
        if not self._has_tables(DELETION_TABLES):
            return []
        with self._sqlite("reading the deletion records"):
            calls = [cid for (cid,) in self._db.execute("SELECT id FROM forget_calls ORDER BY id")]
        records = [self._deletion_record(c) for c in calls]
        if client_ids is None:
            return records
        wanted = {check_int(c, "client id") for c in client_ids}
        return [
            DeletionRecord(
                r.id,
                r.forgotten_at,
                r.client_ids,
                tuple(p for p in r.payloads if p.client_id in wanted),
                r.size_bytes,
                r.file_bytes_before,
                r.file_bytes_after,
                r.vacuum,
                r.models,
            )
            for r in records
            if wanted & set(r.client_ids)
        ]

    def _deletion_record(self, call: int) -> DeletionRecord:
        with self._sqlite("reading a deletion record"):
            row = self._db.execute(
                "SELECT id, forgotten_at, client_ids, size_bytes, file_bytes_before, "
                "file_bytes_after, vacuum FROM forget_calls WHERE id=?",
                (call,),
            ).fetchone()
            payloads = self._db.execute(
                "SELECT round, client_id, size_bytes, sha256, length(fingerprints) "
                "FROM forget_payloads WHERE call_id=? ORDER BY client_id, round",
                (call,),
            ).fetchall()
            models = (
                self._db.execute(
                    "SELECT round, kind, size_bytes, sha256, length(fingerprints) "
                    "FROM forget_models WHERE call_id=? ORDER BY round, kind",
                    (call,),
                ).fetchall()
                if self._ledger
                else []
            )
        return DeletionRecord(
            id=row[0],
            forgotten_at=row[1],
            client_ids=tuple(json.loads(row[2])),
            payloads=tuple(
                DeletedPayload(r, c, size, sha, n // FINGERPRINT_BYTES)
                for r, c, size, sha, n in payloads
            ),
            size_bytes=row[3],
            file_bytes_before=row[4],
            file_bytes_after=row[5],
            vacuum=row[6],
            models=tuple(
                DroppedModel(r, kind, size, sha, n // FINGERPRINT_BYTES)
                for r, kind, size, sha, n in models
            ),
        )

    def check_deletions(self, client_ids: Iterable[int] | None = None) -> DeletionCheck:
        """Check that every deleted payload of the clients is unreadable and its pages are gone.

        Always scans, whether or not ``forget()`` recorded a deletion: the payloads it looks
        for are (1) those in the deletion records, (2) the models ``forget()`` dropped and (3)
        every update of these clients that the fingerprint ledger says was written but that is
        no longer stored and has no deletion record: deleted outside ``forget()`` (raw SQL,
        another tool), whose pages SQLite leaves in the file unless ``secure_delete`` was on.
        Each recorded payload is read through ``read_update`` (which must refuse it); then
        every page of the database file and every WAL frame is read once and their first
        content bytes looked up among the fingerprints (``deletion.py``). The scan is
        calibrated on up to three live payloads: it must find their pages.

        Args:
            client_ids: Check only these clients' payloads; None for all.

        Returns:
            What was checked and found; ``ok`` is False if anything was readable or found, or
            the calibration failed. ``inconclusive_reason`` says what the scan could not cover.
        """
        wanted = None if client_ids is None else {check_int(c, "client id") for c in client_ids}
        gaps: list[str] = []
        usable = self._usable_page_size()
        deleted: dict[bytes, str] = {}
        recorded: set[tuple[int, int]] = set()
        problems, checked, unreadable, not_scanned = self._check_recorded(wanted, recorded, deleted)
        unrecorded, blind = self._unrecorded(wanted, recorded, deleted)
        unrecorded = sorted(set(unrecorded) | set(self._unrecorded_by_catalogue(wanted, recorded)))
        missing = self._missing_models()
        self._add_model_prints(missing, deleted)
        kept = self._scalars_kept(wanted)
        problems += self._catalogue_problems(unrecorded, missing, kept)
        if blind:
            gaps.append(
                f"{blind} update(s) deleted outside forget() fitted inside a b-tree page and "
                "have no page fingerprint, so the scan cannot look for them"
            )
        old = self._unledgered(wanted, recorded | set(unrecorded))
        if old:
            gaps.append(
                f"{len(old)} update(s) of these clients in rounds written before the "
                "fingerprint ledger existed are neither stored nor in a deletion record (e.g. "
                f"{', '.join(f'round {r} client {c}' for r, c in old[:3])}): never kept by the "
                "history policy, or deleted outside forget(); the scan cannot tell"
            )
        for fp in self._live_fingerprints():  # the same bytes are still stored, on purpose
            deleted.pop(fp, None)  # (e.g. M_t == M_{t+1} after a round with no update)
        control = self._control_fingerprints(usable)
        found, pages = scan_pages(self._file, usable, set(deleted) | control)
        shared = self._live_anchor_prints(found & set(deleted), usable)
        found -= shared  # a kept payload holds these bytes too: a hit says nothing either way
        shadowed = _shadowed(deleted, shared)
        if shadowed:
            gaps.append(
                f"{len(shadowed)} deleted payload(s) ({', '.join(shadowed[:3])}) share every "
                "fingerprint the scan looks for with payloads still stored, so it cannot tell a "
                "leftover of them from the kept copies"
            )
        hits = sorted({deleted[fp] for fp in found if fp in deleted})
        problems += [f"{what}: a page of it is still in the files" for what in hits]
        control_found = len(found & control)
        if control and control_found < len(control):
            problems.append(
                f"the page scan found {control_found} of {len(control)} pages of live payloads, "
                "so it is inconclusive for deleted ones (page layout not as expected)"
            )
            gaps.insert(0, problems[-1])
        return DeletionCheck(
            ok=not problems,
            payloads_checked=checked,
            unreadable=unreadable,
            fingerprints_checked=len(deleted) - len(shared),
            fingerprints_found=len(found & set(deleted)),
            not_scanned=not_scanned,
            control_checked=len(control),
            control_found=control_found,
            pages_scanned=pages,
            problems=tuple(problems),
            unrecorded=tuple(unrecorded),
            inconclusive_reason="; ".join(gaps) or None,
            missing_models=tuple(missing),
            scalars_kept=tuple(kept),
        )

    def _check_recorded(
        self, wanted: set[int] | None, recorded: set[tuple[int, int]], deleted: dict[bytes, str]
    ) -> tuple[list[str], int, int, int]:
        """Read back every recorded deleted payload of ``wanted``; collect the prints to scan.

        Adds each recorded ``(round, client)`` to ``recorded`` and the fingerprints of the
        deleted payloads and dropped models to ``deleted``.

        Returns:
            The problems (a payload still readable), and how many payloads were checked, were
            unreadable and have no fingerprint to scan for.
        """
        problems: list[str] = []
        checked = unreadable = not_scanned = 0
        with self._sqlite("reading the deletion records"):
            rows = (
                self._db.execute(
                    "SELECT round, client_id, fingerprints FROM forget_payloads "
                    "ORDER BY client_id, round"
                ).fetchall()
                if self._has_tables(DELETION_TABLES)
                else []
            )
            models = (
                self._db.execute("SELECT round, kind, fingerprints FROM forget_models").fetchall()
                if self._ledger
                else []
            )
        for round, cid, prints in rows:
            if wanted is not None and cid not in wanted:
                continue
            recorded.add((round, cid))
            checked += 1
            try:
                self.read_update(round, cid)
                problems.append(f"round {round} client {cid}: still readable")
            except HistoryCorruptError:
                problems.append(f"round {round} client {cid}: a damaged copy is still stored")
            except HistoryError:  # ForgottenDataError, or the round itself was dropped since
                unreadable += 1
            if not prints:
                not_scanned += 1
            for fp in split_fingerprints(prints):
                deleted.setdefault(fp, f"round {round} client {cid}")
        for round, kind, prints in models:
            for fp in split_fingerprints(prints):
                deleted.setdefault(fp, f"round {round} {kind} model (dropped by forget)")
        return problems, checked, unreadable, not_scanned

    @staticmethod
    def _catalogue_problems(
        unrecorded: list[tuple[int, int]],
        missing: list[tuple[int, str]],
        kept: list[tuple[int, int]],
    ) -> list[str]:
        """One line per kind of deletion the catalogue shows did not hold."""
        out = []
        if unrecorded:
            shown = ", ".join(f"round {r} client {c}" for r, c in unrecorded[:3])
            out.append(
                f"{len(unrecorded)} update(s) the catalogue says were kept are gone with no "
                f"deletion record (deleted outside forget(): {shown})"
            )
        if missing:
            shown = ", ".join(f"round {r} {k}" for r, k in missing[:3])
            out.append(
                f"{len(missing)} model(s) the catalogue says were kept are gone with no "
                f"deletion record ({shown})"
            )
        if kept:
            out.append(
                f"{len(kept)} round record(s) of forgotten clients still hold the norm or "
                "<delta, aggregate> of a deleted update (forget() again drops them)"
            )
        return out

    def _unrecorded_by_catalogue(
        self, wanted: set[int] | None, recorded: set[tuple[int, int]]
    ) -> list[tuple[int, int]]:
        """Updates the clients' rows (or the ``all`` policy) say were kept, gone unrecorded.

        A row whose ``stored_at`` is set kept its update; before that marker existed, a row
        ``accepted`` under ``history.policy: all`` did. Gone without ``forgotten_at`` or a
        deletion record: deleted outside ``forget()`` (its ledger row may have gone too).
        """
        marker = "c.stored_at IS NOT NULL" if self._has_stored_at else "0"
        condition = marker
        if self.policy == "all":
            row = self._db.execute(
                "SELECT value FROM info WHERE key='stored_from_round'"
            ).fetchone()
            since = int(row[0]) if row else 1 << 62
            condition = f"({marker} OR (c.status='accepted' AND c.round < {since}))"
        with self._sqlite("reading the catalogue"):
            rows = self._db.execute(
                "SELECT c.round, c.client_id FROM clients c WHERE c.round > 0 AND "
                f"c.forgotten_at IS NULL AND {condition} AND NOT EXISTS (SELECT 1 FROM payloads "
                "p WHERE p.round=c.round AND p.kind='update' AND p.client_id=c.client_id) "
                "ORDER BY c.client_id, c.round"
            ).fetchall()
        return [
            (r, c) for r, c in rows if (wanted is None or c in wanted) and (r, c) not in recorded
        ]

    def _missing_models(self) -> list[tuple[int, str]]:
        """Models every round keeps, gone with no record of a ``forget()`` that dropped them.

        The global model of every round; the aggregate of every round that aggregated one.
        """
        dropped = set(self.dropped_models()) | set(self.run_meta.dropped_models)
        with self._sqlite("reading the catalogue"):
            globals_ = self._db.execute(
                "SELECT r.round FROM rounds r WHERE NOT EXISTS (SELECT 1 FROM payloads p WHERE "
                "p.round=r.round AND p.kind='global')"
            ).fetchall()
            aggregates = self._db.execute(
                "SELECT r.round FROM rounds r WHERE r.round > 0 AND EXISTS (SELECT 1 FROM "
                "clients c WHERE c.round=r.round AND c.status='accepted') AND NOT EXISTS "
                "(SELECT 1 FROM payloads p WHERE p.round=r.round AND p.kind='aggregate')"
            ).fetchall()
        found = [(r, "global") for (r,) in globals_] + [(r, "aggregate") for (r,) in aggregates]
        return sorted(m for m in found if m not in dropped)

    def _add_model_prints(self, missing: list[tuple[int, str]], deleted: dict[bytes, str]) -> None:
        """Scan for the ledger prints of the models gone unrecorded too."""
        if not missing or not self._ledger:
            return
        with self._sqlite("reading the fingerprint ledger"):
            for round, kind in missing:
                row = self._db.execute(
                    "SELECT fingerprints FROM payload_prints WHERE round=? AND kind=? AND "
                    "client_id=?",
                    (round, kind, NO_CLIENT),
                ).fetchone()
                for fp in split_fingerprints(row[0] if row else b""):
                    deleted.setdefault(fp, f"round {round} {kind} model (deleted outside forget)")

    def _scalars_kept(self, wanted: set[int] | None) -> list[tuple[int, int]]:
        """Rows of forgotten clients that still hold what rebuilds their deleted updates."""
        with self._sqlite("reading the catalogue"):
            gone = {c for (c,) in self._db.execute("SELECT DISTINCT client_id FROM forget_log")}
            rows = self._db.execute(
                "SELECT round, client_id, norm, scalars FROM clients ORDER BY client_id, round"
            ).fetchall()
        return [
            (r, c)
            for r, c, norm, text in rows
            if c in gone
            and (wanted is None or c in wanted)
            and (norm is not None or REBUILDING_SCALARS & set(json.loads(text)))
        ]

    def _live_anchor_prints(self, hits: set[bytes], usable: int) -> set[bytes]:
        """Of ``hits``, those that a payload still stored holds too, at any of its anchors.

        The ledger keeps a payload's first ``MAX_ANCHORS`` anchors only, so a deleted model's
        window can match content that a kept model holds at a later anchor (weights no round
        changed: the inputs of pixels that are always blank). The scan then finds the kept
        copy, which says nothing about the deleted one: such a print counts neither as found
        nor as checked (``_shadowed``). Read only when the scan found something.
        """
        if not hits:
            return set()
        live: set[bytes] = set()
        with self._sqlite("reading the stored payloads"):
            rows = self._db.execute(
                "SELECT NULL, round, kind, client_id, dtype, shape, size_bytes, crc32, data "
                "FROM payloads"
            )
            for row in rows:
                live |= set(split_fingerprints(anchor_prints(row, usable, None))) & hits
        return live

    def _live_fingerprints(self) -> set[bytes]:
        """Fingerprints the ledger holds for payloads still stored."""
        if not self._ledger:
            return set()
        with self._sqlite("reading the fingerprint ledger"):
            rows = self._db.execute(
                "SELECT l.fingerprints FROM payload_prints l WHERE EXISTS (SELECT 1 FROM "
                "payloads p WHERE p.round=l.round AND p.kind=l.kind AND p.client_id=l.client_id)"
            )
            return {fp for (prints,) in rows for fp in split_fingerprints(prints)}

    def _unrecorded(
        self,
        wanted: set[int] | None,
        recorded: set[tuple[int, int]],
        deleted: dict[bytes, str],
    ) -> tuple[list[tuple[int, int]], int]:
        """Add the ledger's prints of updates gone without a record; return them and the blind."""
        if not self._ledger:
            return [], 0
        with self._sqlite("reading the fingerprint ledger"):
            rows = self._db.execute(
                "SELECT l.round, l.client_id, l.fingerprints FROM payload_prints l WHERE "
                "l.kind='update' AND NOT EXISTS (SELECT 1 FROM payloads p WHERE p.round=l.round "
                "AND p.kind='update' AND p.client_id=l.client_id) ORDER BY l.client_id, l.round"
            ).fetchall()
        out: list[tuple[int, int]] = []
        blind = 0
        for round, cid, prints in rows:
            if (wanted is not None and cid not in wanted) or (round, cid) in recorded:
                continue
            out.append((round, cid))
            blind += not prints
            for fp in split_fingerprints(prints):
                deleted.setdefault(fp, f"round {round} client {cid} (deleted outside forget)")
        return out, blind

    def _unledgered(
        self, wanted: set[int] | None, recorded: set[tuple[int, int]]
    ) -> list[tuple[int, int]]:
        """Updates of ``wanted`` before the ledger's first round, not stored and not recorded."""
        with self._sqlite("reading the fingerprint ledger's coverage"):
            row = self._db.execute(
                "SELECT value FROM info WHERE key='prints_from_round'"
            ).fetchone()
            first = int(row[0]) if row else None
            if first == 0:
                return []
            limit = "" if first is None else f" AND c.round < {first}"
            rows = self._db.execute(
                "SELECT c.round, c.client_id FROM clients c WHERE c.status != 'missing' "
                "AND NOT EXISTS (SELECT 1 FROM payloads p WHERE p.round=c.round AND "
                "p.kind='update' AND p.client_id=c.client_id)"
                + limit
                + " ORDER BY c.client_id, c.round"
            ).fetchall()
        return [
            (r, c) for r, c in rows if (wanted is None or c in wanted) and (r, c) not in recorded
        ]

    def _control_fingerprints(self, usable: int) -> set[bytes]:
        """Fingerprints (overflow pages and anchors) of up to three live payloads."""
        with self._sqlite("choosing live payloads for the scan's calibration"):
            ids = self._db.execute(
                "SELECT id FROM payloads ORDER BY round DESC, kind, client_id LIMIT 3"
            ).fetchall()
            out: set[bytes] = set()
            for (pid,) in ids:
                out.update(split_fingerprints(self._evidence(pid, usable)[4]))
        return out


def _shadowed(deleted: dict[bytes, str], shared: set[bytes]) -> list[str]:
    """The deleted payloads every print of which a kept payload holds too (none left to find)."""
    prints: dict[str, set[bytes]] = {}
    for fp, what in deleted.items():
        prints.setdefault(what, set()).add(fp)
    return sorted(what for what, fps in prints.items() if fps <= shared)
