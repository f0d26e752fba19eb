"""What the store shows about the forgotten clients' updates: one frozen value for every reader.

``HistoryStore.deletion_evidence(ids)`` reads it once: the bytes still held, the deletion
records, a read-back of every round a forgotten client took part in, the page scan with the
catalogue's account of what was kept (``check_deletions``: ``unrecorded`` updates,
``missing_models``, ``scalars_kept``), and the deleted updates still rebuildable
(``reconstruction``). The receipt's ``deletion`` rule, ``fedunlearn forget`` and ``verify``
read the same value (``to_dict`` is the receipt's JSON); a run directory adds the result files
that still hold the clients' updates (``fedunlearn.runs.forget.result_files_holding``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from fedunlearn.history.store.deletion import DeletionCheck

__all__ = ["DeletionEvidence"]


@dataclass(frozen=True)
class DeletionEvidence:
    """The store's evidence about the forgotten clients' update payloads.

    Attributes:
        clients: The forgotten client ids.
        bytes_held: Client id -> update payload bytes still stored.
        payloads_held: How many of their update payloads are still stored.
        records: The deletion records about these clients (``forget_records()``, dicts).
        read_back: Every round a forgotten client took part in whose update is not stored,
            read: ``refused`` (deleted), ``not_stored`` (never kept), ``readable``
            ([round, client] still readable: a failure) and ``attempted``.
        check: The page scan and the catalogue's account (``HistoryStore.check_deletions``).
        reconstructible: [round, client] of deleted updates still rebuildable.
        result_files: Files in the run directory holding the clients' updates (path, size,
            updates), added by the run directory's reader; empty when none (or not looked).
    """

    clients: tuple[int, ...]
    bytes_held: dict[int, int]
    payloads_held: int
    records: tuple[dict[str, Any], ...]
    read_back: dict[str, Any]
    check: DeletionCheck
    reconstructible: tuple[tuple[int, ...], ...] = ()  # (round, client) pairs
    result_files: tuple[dict[str, Any], ...] = field(default_factory=tuple)

    def with_result_files(self, files: list[dict[str, Any]]) -> DeletionEvidence:
        """The same evidence with the run directory's result files that hold the updates."""
        return dataclasses.replace(self, result_files=tuple(files))

    def to_dict(self) -> dict[str, Any]:
        """The receipt's ``deletion`` evidence (what the ``deletion`` rule reads), JSON-ready."""
        c = self.check
        return {
            "clients": list(self.clients),
            "bytes_held": dict(self.bytes_held),
            "payloads_held": self.payloads_held,
            "records": [dict(r) for r in self.records],
            "read_back": dict(self.read_back),
            "page_scan": {
                "ran": True,
                "fragments_found": c.fingerprints_found,
                "fingerprints_checked": c.fingerprints_checked,
                "pages_scanned": c.pages_scanned,
                "unrecorded": [list(p) for p in c.unrecorded],
                "problems": list(c.problems),
                "inconclusive_reason": c.inconclusive_reason,
            },
            "scan": {
                "ok": c.fingerprints_found == 0 and c.unreadable == c.payloads_checked,
                "reason": "; ".join(p for p in c.problems[:3] if "live payloads" not in p) or None,
            },
            "unrecorded": [list(p) for p in c.unrecorded],
            "missing_models": [list(m) for m in c.missing_models],
            "scalars_kept": [list(p) for p in c.scalars_kept],
            "reconstructible": [list(p) for p in self.reconstructible],
            "result_files": [dict(f) for f in self.result_files],
        }
