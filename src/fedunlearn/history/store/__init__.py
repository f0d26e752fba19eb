"""The on-disk history of a run.

Values (``records``), payload layout (``codec``), the SQLite store (``sqlite``) and the read-only
protocol unlearning methods use (``reader``).
"""

from fedunlearn.history.store.reader import HistoryReader
from fedunlearn.history.store.records import ClientRecord, ForgetRecord, RoundEntry, Scalar
from fedunlearn.history.store.sqlite import FILE_NAME, LOCK_NAME, SCHEMA_VERSION, HistoryStore

__all__ = [
    "FILE_NAME",
    "LOCK_NAME",
    "SCHEMA_VERSION",
    "ClientRecord",
    "ForgetRecord",
    "HistoryReader",
    "HistoryStore",
    "RoundEntry",
    "Scalar",
]
