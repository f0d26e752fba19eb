"""Frozen values describing what happened in a round.

Update convention (used everywhere in fedunlearn; docs/methods/baselines.md, "Conventions
shared by the federated methods"): ``delta = LocalSGD(M_t; E epochs, lr) - M_t`` is what a client
uploads, a flat float32 vector; the papers' "gradient" (Crab Sec. II-A, Starfish Sec. II-A) is
``g = -delta / lr`` (SF1 in docs/methods/starfish.md); the aggregate is a delta too and
``M_{t+1} = M_t + aggregate``. Rounds are 1-based; round 0 is the initial model M_0.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import torch

from fedunlearn.errors import UnknownClientError


@dataclass(frozen=True)
class ClientData:
    """One client's local training set: inputs and int64 labels as torch tensors.

    ``ids``: each row's stable sample id within the client (ascending), when rows were deleted
    (a sample-level deletion keeps the others' ids); None means ``0..n-1``. Deletion-consistent
    mini-batches (``fl.sampling.step_batches``) key their draws by these ids, not by position.
    """

    x: torch.Tensor
    y: torch.Tensor
    ids: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def sample_ids(self) -> torch.Tensor:
        """Return the rows' stable sample ids (int64, ascending)."""
        if self.ids is None:
            return torch.arange(len(self), dtype=torch.int64)
        return self.ids

    def without(self, sample_ids: Iterable[int]) -> ClientData:
        """Return this data without the rows whose stable ids are in ``sample_ids``."""
        ids = self.sample_ids()
        drop = torch.tensor(sorted({int(i) for i in sample_ids}), dtype=torch.int64)
        keep = ~torch.isin(ids, drop)
        return ClientData(self.x[keep], self.y[keep], ids[keep].clone())


@dataclass(frozen=True)
class ClientUpdate:
    """A client's upload for one round: the model delta and what it trained on."""

    client_id: int
    delta: torch.Tensor
    num_samples: int
    train_loss: float


class UpdateStatus(StrEnum):
    """What the server did with a client's upload."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"  # NaN/Inf or wrong shape: excluded from the aggregate
    MISSING = "missing"  # sampled but did not reply


@dataclass(frozen=True)
class RejectedUpdate:
    """An upload the server refused, with the reason."""

    client_id: int
    reason: str
    num_samples: int = 0


@dataclass(frozen=True)
class RoundRecord:
    """Everything observable at the end of round ``round``; observers get one per round."""

    round: int
    global_before: torch.Tensor
    global_after: torch.Tensor
    aggregate: torch.Tensor
    updates: tuple[ClientUpdate, ...]
    rejected: tuple[RejectedUpdate, ...] = ()
    metrics: dict[str, float] = field(default_factory=dict)
    # client -> draws it won this round (TV-stable sampling with replacement); empty: one each
    multiplicity: Mapping[int, int] = field(default_factory=dict)
    # shard -> its model after the round (a sharded run; ``global_after`` is their combination)
    shard_models: Mapping[int, torch.Tensor] = field(default_factory=dict)

    @property
    def participants(self) -> tuple[int, ...]:
        """Client ids whose update entered the aggregate, in upload order."""
        return tuple(u.client_id for u in self.updates)


def check_task_clients(
    tasks: Sequence[tuple[int, int]], known: Collection[int], holder: str = "this executor"
) -> None:
    """Raise ``UnknownClientError`` naming the ``(client_id, seed)`` tasks' unknown clients."""
    unknown = sorted({cid for cid, _ in tasks} - set(known))
    if unknown:
        raise UnknownClientError(
            f"client(s) {', '.join(map(str, unknown))} have no data in {holder}"
        )
