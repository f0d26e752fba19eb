"""An unlearned trajectory: the rounds a method computed, in the store's own unit (``RoundEntry``).

A method that computes a whole new trajectory (Retrain, FedEraser, FedRecover, Crab) may return it
as ``UnlearnResult.trajectory``, so that applying the result can make that trajectory the run's
history: later requests then read a history in which the forgotten clients took no part, and the
original rounds (whose aggregates and global models would let a deleted update be rebuilt) can be
dropped (docs/lifecycle.md).

Conventions:

- ``rounds`` are rounds 1..L of the new history, numbered consecutively from 1; round 0 (M_0) is
  the run's own and is not repeated. L may differ from the original run's length (a method's
  final tuning rounds are extra rounds; a replay that skips rounds is shorter).
- Each round holds ``global_model`` (the model after it), the ``aggregate`` it applied, the
  ``updates`` of the clients it used (never a forgotten client's) and one ``ClientRecord`` per
  client in it. An update the method estimated rather than had a client compute (FedRecover's
  L-BFGS estimates, FedEraser's calibrated updates, Crab's calibrated replays) carries
  ``scalars["estimated"] = True`` in its ``ClientRecord``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedunlearn.errors import ConfigError
from fedunlearn.history.store import RoundEntry

__all__ = ["ESTIMATED_KEY", "Trajectory"]

ESTIMATED_KEY = "estimated"


@dataclass(frozen=True)
class Trajectory:
    """Rounds 1..L of an unlearned history, without any of ``forgotten``.

    Attributes:
        rounds: The rounds, in order, numbered 1..L.
        forgotten: The clients the trajectory was computed without.
    """

    rounds: tuple[RoundEntry, ...]
    forgotten: frozenset[int]

    def __post_init__(self) -> None:
        object.__setattr__(self, "rounds", tuple(self.rounds))
        object.__setattr__(self, "forgotten", frozenset(int(c) for c in self.forgotten))
        if not self.rounds:
            raise ConfigError("a trajectory needs at least one round")
        for expected, entry in enumerate(self.rounds, start=1):
            if entry.round != expected:
                raise ConfigError(
                    f"trajectory rounds must be numbered 1..L in order; round {expected} is "
                    f"numbered {entry.round}"
                )
            if entry.global_model is None:
                raise ConfigError(f"trajectory round {expected} has no global model")
            present = {c.client_id for c in entry.clients} | set(entry.updates)
            taken = sorted(present & self.forgotten)
            if taken:
                raise ConfigError(
                    f"trajectory round {expected} includes forgotten client(s) {taken}"
                )

    @property
    def length(self) -> int:
        """L, the number of rounds."""
        return len(self.rounds)

    @property
    def final_model(self) -> torch.Tensor:
        """M̂_L, the model after the last round (the result's model)."""
        model = self.rounds[-1].global_model
        assert model is not None  # checked in __post_init__
        return model

    def estimated_updates(self) -> int:
        """How many of the trajectory's updates were estimated rather than computed by clients."""
        return sum(
            1 for e in self.rounds for c in e.clients if c.scalars.get(ESTIMATED_KEY) is True
        )
