"""Frozen values describing what happened in a round.

Update convention (used everywhere in fedunlearn; docs/methods/baselines.md, "Conventions
shared by the federated methods"): ``delta = LocalSGD(M_t; E epochs, lr) - M_t`` is what a client
uploads, a flat float32 vector; the papers' "gradient" (Crab Sec. II-A, Starfish Sec. II-A) is
``g = -delta / lr`` (SF1 in docs/methods/starfish.md); the aggregate is a delta too and
``M_{t+1} = M_t + aggregate``. Rounds are 1-based; round 0 is the initial model M_0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import torch


@dataclass(frozen=True)
class ClientData:
    """One client's local training set: inputs and int64 labels as torch tensors."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return int(self.y.shape[0])


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

    @property
    def participants(self) -> tuple[int, ...]:
        """Client ids whose update entered the aggregate, in upload order."""
        return tuple(u.client_id for u in self.updates)
