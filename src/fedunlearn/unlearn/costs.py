"""What an unlearning run cost: the ``Costs`` record and the meter that adds it up.

``Costs`` is the one cost record (frozen; ``UnlearnResult.costs``). A method never counts by
hand: the context's wrappers add to its ``CostMeter`` as the method works (client training,
history reads) and ``UnlearnContext.end_round`` counts each unlearning round.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

__all__ = ["CostMeter", "Costs"]


@dataclass(frozen=True)
class Costs:
    """What an unlearning run cost.

    ``rounds`` counts unlearning rounds (one ``round_metrics`` row each);
    ``client_participations`` counts (client, round) local trainings, i.e. the exact-update
    requests; ``client_epochs`` the local epochs they ran (the papers' round saving follows from
    it against Retrain); ``estimated_updates`` the client updates the server estimated instead
    (FedRecover, Starfish); ``history_bytes_read`` the payload bytes read from the store;
    ``bytes_communicated`` the model and update bytes sent to and received from clients.
    """

    wall_seconds: float = 0.0
    rounds: int = 0
    client_participations: int = 0
    client_epochs: int = 0
    estimated_updates: int = 0
    history_bytes_read: int = 0
    bytes_communicated: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Return the ledger as a JSON-ready dict."""
        return asdict(self)


_COUNTERS = tuple(f.name for f in fields(Costs) if f.name != "wall_seconds")


class CostMeter:
    """The running ``Costs`` of one method run (its counters; the wall time is the caller's).

    ``costs`` is the record so far; ``add`` adds to its counters. A diagnostic whose work is not
    a cost (e.g. a reference retraining) saves ``costs`` and puts it back.
    """

    def __init__(self) -> None:
        self.costs = Costs()

    def add(self, **counts: int) -> None:
        """Add to counters of ``Costs`` by name (``add(rounds=1, client_epochs=5)``).

        Raises:
            ValueError: for a name that is not a counter of ``Costs``.
        """
        unknown = sorted(set(counts) - set(_COUNTERS))
        if unknown:
            raise ValueError(f"not a cost counter: {', '.join(unknown)}; counters: {_COUNTERS}")
        c = self.costs
        self.costs = replace(c, **{k: getattr(c, k) + int(v) for k, v in counts.items()})

    def counts(self) -> dict[str, int]:
        """Return the counters as a dict (no wall time)."""
        return {name: getattr(self.costs, name) for name in _COUNTERS}
