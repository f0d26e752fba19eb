"""``HistoryReader``: the read side of a run's history, as an unlearning method sees it.

``HistoryStore`` (the SQLite store) implements it, and so does the metered view an unlearning
context hands a method (``fedunlearn.unlearn.context.MeteredHistory``, which also counts the
payload bytes read). Code that only reads history takes a ``HistoryReader``.

``SizedUpdates`` is what a reader adds to say the bytes each update takes as stored (the store:
a float16 payload reads as float32 but takes 2 bytes a value), so a meter counts those.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import torch

from fedunlearn.history.store.records import ClientRecord, Scalar

__all__ = ["HistoryReader", "SizedUpdates"]


@runtime_checkable
class HistoryReader(Protocol):
    """Read-only access to a run's stored rounds."""

    @property
    def meta(self) -> dict[str, Any]:
        """The run's metadata (config, client sizes, policy, ...)."""
        ...

    @property
    def policy(self) -> str:
        """The recording policy the run used (``history.policy``)."""
        ...

    def rounds(self) -> list[int]:
        """Committed rounds, ascending (0 = M_0)."""
        ...

    def read_model(self, round: int, kind: str = "global") -> torch.Tensor:
        """The global model after ``round`` (``kind="aggregate"``: the round's aggregate)."""
        ...

    def read_update(self, round: int, client_id: int) -> torch.Tensor:
        """A stored client delta."""
        ...

    def read_shard_model(self, round: int, shard: int) -> torch.Tensor:
        """A shard's model after ``round`` (a sharded run)."""
        ...

    def has_update(self, round: int, client_id: int) -> bool:
        """Whether a client's delta of ``round`` is stored."""
        ...

    def iter_updates(self, round: int) -> Iterator[tuple[int, torch.Tensor]]:
        """Stream the stored deltas of a round by increasing client id."""
        ...

    def client_records(self, round: int) -> list[ClientRecord]:
        """Every sampled client's outcome in ``round``."""
        ...

    def round_scalars(self, round: int) -> dict[str, Scalar]:
        """The metrics recorded for ``round``."""
        ...

    def stored_bytes(self) -> int:
        """Payload bytes the store keeps."""
        ...


@runtime_checkable
class SizedUpdates(Protocol):
    """A reader that also gives the bytes each update's payload takes as stored."""

    def read_sized_update(self, round: int, client_id: int) -> tuple[torch.Tensor, int]:
        """``read_update``'s tensor and its payload's bytes as stored."""
        ...

    def iter_sized_updates(self, round: int) -> Iterator[tuple[int, torch.Tensor, int]]:
        """``iter_updates`` with each payload's bytes as stored."""
        ...
