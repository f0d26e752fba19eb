"""The on-disk history of a run.

Values (``records``), payload layout (``codec``), the SQLite store (``sqlite``: its schema in
``schema``, its damage checks in ``damage``, its writer lock in ``lock``, its reads in
``reading``, its round writes in ``writing``, its deleting methods in ``erasure`` and their
records and checks in ``audit``, its checks in ``integrity``, its applied results in ``events``,
its committed history in ``chain``; its metadata's typed record in ``metadata``), the evidence
of deletions (``deletion``), the reconstruction attack and what ``forget()`` drops against it
(``reconstruction``) and the read-only protocol unlearning methods use (``reader``).
"""

from fedunlearn.history.store.deletion import (
    DeletedPayload,
    DeletionCheck,
    DeletionRecord,
    DroppedModel,
)
from fedunlearn.history.store.events import AppliedEvent
from fedunlearn.history.store.metadata import Continuation, RunMeta, parse_run_meta, run_meta_of
from fedunlearn.history.store.reader import HistoryReader, SizedUpdates
from fedunlearn.history.store.reading import as_read
from fedunlearn.history.store.records import (
    ClientRecord,
    ForgetRecord,
    RoundEntry,
    Scalar,
    StoreCheck,
)
from fedunlearn.history.store.sqlite import (
    FILE_NAME,
    LOCK_NAME,
    SCHEMA_VERSION,
    DroppedModelError,
    HistoryStore,
    WriterLock,
)

__all__ = [
    "FILE_NAME",
    "LOCK_NAME",
    "SCHEMA_VERSION",
    "AppliedEvent",
    "ClientRecord",
    "Continuation",
    "DeletedPayload",
    "DeletionCheck",
    "DeletionRecord",
    "DroppedModel",
    "DroppedModelError",
    "ForgetRecord",
    "HistoryReader",
    "HistoryStore",
    "RoundEntry",
    "RunMeta",
    "Scalar",
    "SizedUpdates",
    "StoreCheck",
    "WriterLock",
    "as_read",
    "parse_run_meta",
    "run_meta_of",
]
