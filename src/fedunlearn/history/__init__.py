"""History of a federated run: the on-disk store (``store``); what to keep is ``policy``."""

from fedunlearn.history.store import ClientRecord, ForgetRecord, HistoryStore, RoundEntry

__all__ = ["ClientRecord", "ForgetRecord", "HistoryStore", "RoundEntry"]
