"""An unlearned trajectory: the rounds a method computed, in the store's own unit (``RoundEntry``).

A method that computes a whole new trajectory (Retrain, FedEraser, FedRecover, Crab) may return it
as ``UnlearnResult.trajectory``, so that applying the result can make that trajectory the run's
history: later requests then read a history in which the forgotten clients took no part, and the
original rounds (whose aggregates and global models would let a deleted update be rebuilt) can be
dropped (docs/lifecycle.md).

Conventions:

- ``rounds`` are rounds 1..L of the new history, numbered consecutively from 1; round 0 (M_0) is
  the run's own and is not repeated. A trajectory may keep a prefix of the run's own rounds
  unchanged (``kept``: rounds 1..kept are the run's, which no forgotten client or deleted sample
  touched; an exact replay from a later round); ``rounds`` then holds rounds kept+1..L only.
  L may differ from the original run's length (a method's final tuning rounds are extra rounds;
  a replay that skips rounds is shorter).
- Each round holds ``global_model`` (the model after it), the ``aggregate`` it applied, the
  ``updates`` of the clients it used (never a forgotten client's) and one ``ClientRecord`` per
  client in it. An update the method estimated rather than had a client compute (FedRecover's
  L-BFGS estimates, FedEraser's calibrated updates, Crab's calibrated replays) carries
  ``scalars["estimated"] = True`` in its ``ClientRecord``.
- ``rounds`` is a tuple, or ``history.spool.SpooledRounds``: the rounds' tensors on disk, each
  round read back when accessed (how a method's ``TrajectoryLog`` returns them).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from fedunlearn.errors import ConfigError
from fedunlearn.history.spool import SpooledRounds
from fedunlearn.history.store import RoundEntry

__all__ = ["ESTIMATED_KEY", "Trajectory"]

ESTIMATED_KEY = "estimated"


@dataclass(frozen=True)
class Trajectory:
    """Rounds 1..L of an unlearned history, without any of ``forgotten``.

    Attributes:
        rounds: The computed rounds, in order, numbered kept+1..L.
        forgotten: The clients the trajectory was computed without.
        kept: Rounds 1..kept are the run's own rounds, kept unchanged (0: none).
    """

    rounds: Sequence[RoundEntry]
    forgotten: frozenset[int]
    kept: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.rounds, SpooledRounds):
            object.__setattr__(self, "rounds", tuple(self.rounds))
        object.__setattr__(self, "forgotten", frozenset(int(c) for c in self.forgotten))
        if self.kept < 0:
            raise ConfigError(f"a trajectory keeps >= 0 rounds; got {self.kept}")
        if not self.rounds and not self.kept:
            raise ConfigError("a trajectory needs at least one round")
        for expected, (number, has_model, present) in enumerate(
            self._outline(), start=self.kept + 1
        ):
            if number != expected:
                raise ConfigError(
                    f"trajectory rounds must be numbered 1..L in order; round {expected} is "
                    f"numbered {number}"
                )
            if not has_model:
                raise ConfigError(f"trajectory round {expected} has no global model")
            taken = sorted(present & self.forgotten)
            if taken:
                raise ConfigError(
                    f"trajectory round {expected} includes forgotten client(s) {taken}"
                )

    def _outline(self) -> Iterator[tuple[int, bool, set[int]]]:
        """Per round: its number, whether it has a global model, the clients in it."""
        entries = self.rounds.heads if isinstance(self.rounds, SpooledRounds) else self.rounds
        for entry in entries:
            clients = {c.client_id for c in entry.clients} | set(entry.updates)
            yield entry.round, entry.global_model is not None, clients

    @property
    def length(self) -> int:
        """L, the number of rounds (kept and computed)."""
        return self.kept + len(self.rounds)

    @property
    def final_model(self) -> torch.Tensor:
        """M̂_L, the model after the last computed round (the result's model).

        Raises:
            ConfigError: every round is kept (the model is the run's own last one).
        """
        if not self.rounds:
            raise ConfigError("this trajectory keeps every round; its model is the run's own")
        model = self.rounds[-1].global_model
        assert model is not None  # checked in __post_init__
        return model

    def num_updates(self) -> int:
        """How many client updates the computed rounds hold (without reading a spooled one)."""
        entries = self.rounds.heads if isinstance(self.rounds, SpooledRounds) else self.rounds
        return sum(len(e.updates) for e in entries)

    def estimated_updates(self) -> int:
        """How many of the trajectory's updates were estimated rather than computed by clients."""
        entries = self.rounds.heads if isinstance(self.rounds, SpooledRounds) else self.rounds
        return sum(1 for e in entries for c in e.clients if c.scalars.get(ESTIMATED_KEY) is True)
