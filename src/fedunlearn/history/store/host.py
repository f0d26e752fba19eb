"""The declared host of ``HistoryStore``'s mixins, for the type checker only.

``Writing``, ``Reading``, ``Erasure``, ``DeletionAudit``, ``Integrity``, ``Generations`` and
``Chain`` are the parts of ``HistoryStore`` (``sqlite``) that write rounds, read, delete, show
the deletions held, check, apply and chain;
each uses the store's connection, its helpers and some methods of the other parts. ``StoreHost``
declares exactly those members, so mypy checks every call a mixin makes against one signature.
The schema checks, the damage checks and the writer lock are composed parts instead: plain
functions and a class with their own interfaces (``schema``, ``damage``, ``lock``).
The mixins subclass it only under ``TYPE_CHECKING``, through ``StoreMixin`` (at run time their
base stays ``object``): nothing here runs.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from fedunlearn.history.store.chain import ChainCheck
    from fedunlearn.history.store.deletion import DeletionRecord
    from fedunlearn.history.store.events import AppliedEvent
    from fedunlearn.history.store.metadata import RunMeta
    from fedunlearn.history.store.records import ClientRecord, ForgetRecord, RoundEntry

__all__ = ["StoreHost", "StoreMixin"]


class StoreHost(Protocol):
    """What the store's mixins use of ``HistoryStore`` and of each other."""

    _file: Path
    _usable: int | None

    # ----- the connection and its guards (sqlite.HistoryStore) -----------------------------

    @property
    def _db(self) -> sqlite3.Connection: ...

    @property
    def _ledger(self) -> bool: ...

    @property
    def _has_stored_at(self) -> bool: ...

    def _has_tables(self, names: Iterable[str]) -> bool: ...

    def _sqlite(self, action: str) -> AbstractContextManager[None]: ...

    def _transaction(self, action: str) -> AbstractContextManager[None]: ...

    def _require_writable(self, action: str) -> None: ...

    def _checkpoint_truncate(self, consequence: str) -> None: ...

    # ----- reading and writing rows (sqlite, reading.Reading, writing.Writing) ---------------

    @property
    def meta(self) -> dict[str, Any]: ...

    @property
    def run_meta(self) -> RunMeta: ...

    @property
    def policy(self) -> str: ...

    def meta_problem(self, meta: Mapping[str, Any] | None = None) -> str | None: ...

    def _put_meta(self, meta: Mapping[str, Any]) -> None: ...

    def rounds(self) -> list[int]: ...

    def client_records(self, round: int) -> list[ClientRecord]: ...

    def read_update(self, round: int, client_id: int) -> torch.Tensor: ...

    def dropped_models(self) -> list[tuple[int, str]]: ...

    def forget_records(self) -> list[ForgetRecord]: ...

    def stored_bytes_by_client(self) -> dict[int, int]: ...

    def file_bytes(self) -> int: ...

    def _insert_round_rows(self, entry: RoundEntry, now: float) -> None: ...

    def _insert_payload(
        self, round: int, kind: str, client_id: int, tensor: torch.Tensor
    ) -> None: ...

    def _payload_row(self, where: str, args: tuple[Any, ...]) -> tuple[Any, ...] | None: ...

    def _decode(self, row: tuple[Any, ...] | None) -> torch.Tensor: ...

    @staticmethod
    def _what(kind: str, client_id: int) -> str: ...

    # ----- deleting (erasure.Erasure) -------------------------------------------------------

    def _payload_ids(self, client_ids: list[int]) -> list[int]: ...

    def _evidence(self, payload_id: int, usable: int) -> tuple[int, int, int, str, bytes]: ...

    def _usable_page_size(self) -> int: ...

    def _incremental_vacuum(self) -> None: ...

    # ----- deletion records (audit.DeletionAudit) -------------------------------------------

    def _deletion_record(self, call: int) -> DeletionRecord: ...

    # ----- checks (integrity.Integrity) -----------------------------------------------------

    def _repair_advice(self, round: int | None) -> str: ...

    # ----- applied events (events.Generations) ----------------------------------------------

    def events(self) -> list[AppliedEvent]: ...

    # ----- the chain (chain.Chain) ----------------------------------------------------------

    def _chain_note_round(self, round: int, scalars_text: str, clients: Iterable[Any]) -> None: ...

    def _chain_note_payload(self, round: int, kind: str, client_id: int, data: Any) -> None: ...

    def _chain_note_removed(self, round: int, kind: str, client_id: int, sha: str) -> None: ...

    def _chain_commit(self, kind: str, **fields: Any) -> None: ...

    def check_chain(self, *, full: bool = True) -> ChainCheck: ...


# The mixins' base: ``StoreHost`` for the type checker, ``object`` at run time.
if TYPE_CHECKING:
    StoreMixin = StoreHost
else:
    StoreMixin = object
