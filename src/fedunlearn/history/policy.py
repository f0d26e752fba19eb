"""Recording policies (what the server keeps of each round) and the recorder that applies them.

The global model of every round (and the round's aggregate) is always kept: it is 1/C of a
round's uploads, every method and ``train --resume`` need it. Policies choose which *client
updates* are stored:

- ``all``: every accepted update (FedRecover, Cao et al. S&P'23 §4);
- ``every``: every update of rounds 1, 1+k, 1+2k, ... (FedEraser's Δt, Liu et al. IWQoS'21 §3);
- ``none``: no client updates (enough for Retrain and the no-unlearning control).

Later methods (Crab, FedADP, Starfish) add policies of their own through the same interface.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from fedunlearn.errors import UnknownNameError
from fedunlearn.fl.records import RoundRecord, UpdateStatus
from fedunlearn.history.store import ClientRecord, HistoryStore, RoundEntry


class RecordingPolicy(Protocol):
    """Decides which client updates of a finished round are written to the store."""

    name: str

    def updates_to_store(self, record: RoundRecord) -> frozenset[int]:
        """Return the ids of the accepted clients whose update is stored."""
        ...


@dataclass(frozen=True)
class RecordAll:
    """Keep every accepted client update of every round."""

    name: str = "all"

    def updates_to_store(self, record: RoundRecord) -> frozenset[int]:
        """Keep all participants."""
        return frozenset(record.participants)


@dataclass(frozen=True)
class RecordEvery:
    """Keep every accepted client update of rounds 1, 1 + k, 1 + 2k, ..."""

    every: int = 5
    name: str = "every"

    def stores_round(self, round_: int) -> bool:
        """Return whether updates of ``round_`` are kept."""
        return (round_ - 1) % self.every == 0

    def updates_to_store(self, record: RoundRecord) -> frozenset[int]:
        """Keep all participants of every k-th round."""
        return frozenset(record.participants) if self.stores_round(record.round) else frozenset()


@dataclass(frozen=True)
class RecordNone:
    """Keep no client update (global models only)."""

    name: str = "none"

    def updates_to_store(self, record: RoundRecord) -> frozenset[int]:
        """Keep nobody."""
        return frozenset()


def make_policy(name: str, every: int = 5) -> RecordingPolicy:
    """Return the recording policy called ``name``."""
    if name == "all":
        return RecordAll()
    if name == "every":
        return RecordEvery(every)
    if name == "none":
        return RecordNone()
    raise UnknownNameError(f"unknown history policy '{name}'; available: all, every, none")


class HistoryRecorder:
    """Round observer that commits each finished round to a ``HistoryStore`` atomically."""

    def __init__(self, store: HistoryStore, policy: RecordingPolicy) -> None:
        self.store = store
        self.policy = policy

    def on_round_end(self, record: RoundRecord) -> None:
        """Write the round: global model, aggregate, chosen updates, every client's outcome."""
        keep = self.policy.updates_to_store(record)
        clients = [
            ClientRecord(
                client_id=u.client_id,
                status=UpdateStatus.ACCEPTED.value,
                num_samples=u.num_samples,
                norm=float(u.delta.norm()),
                loss=float(u.train_loss),
                reason=None,
                scalars={},
            )
            for u in record.updates
        ]
        clients += [
            ClientRecord(
                client_id=r.client_id,
                status=UpdateStatus.REJECTED.value,
                num_samples=r.num_samples,
                norm=None,
                loss=None,
                reason=r.reason,
                scalars={},
            )
            for r in record.rejected
        ]
        self.store.write_round(
            RoundEntry(
                round=record.round,
                global_model=record.global_after,
                aggregate=record.aggregate,
                updates={u.client_id: u.delta for u in record.updates if u.client_id in keep},
                clients=clients,
                scalars=dict(record.metrics),
            )
        )
