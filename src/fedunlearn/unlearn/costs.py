"""What an unlearning run cost: the ``Costs`` record and the meter that adds it up.

``Costs`` is the one cost record (frozen; ``UnlearnResult.costs``). A method never counts by
hand: the context's wrappers add to its ``CostMeter`` as the method works (client training and
the time it takes, history reads), the session's evaluator times the per-round evaluation and
``UnlearnContext.end_round`` counts each unlearning round. ``Unlearner.unlearn`` sets the wall
time: the method's own, without the per-round evaluation and diagnostics (docs/performance.md,
"What the cost columns measure").
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

__all__ = ["CostMeter", "Costs"]


@dataclass(frozen=True)
class Costs:
    """What an unlearning run cost.

    ``wall_seconds`` is the method's own wall time: from its start to its model, less the
    per-round evaluation (``evaluation_seconds``: test metrics for progress and plots, not a cost
    of unlearning) and less diagnostics (``diagnostic_seconds``: e.g. a bound check's reference
    retrain); ``client_train_seconds`` the part of it spent waiting for clients' local training
    and ``server_seconds`` the rest (history reads and decoding, estimation, selection,
    aggregation). ``rounds`` counts unlearning rounds (one ``round_metrics`` row each);
    ``client_participations`` counts (client, round) local trainings, i.e. the exact-update
    requests; ``client_epochs`` the local epochs they ran (the papers' round saving follows from
    it against Retrain); ``estimated_updates`` the client updates the server estimated instead
    (FedRecover, Starfish); ``history_bytes_read`` the payload bytes read from the store;
    ``bytes_communicated`` the model and update bytes sent to and received from clients (float32
    model down, delta up: 8 d bytes per local training).
    """

    wall_seconds: float = 0.0
    rounds: int = 0
    client_participations: int = 0
    client_epochs: int = 0
    estimated_updates: int = 0
    history_bytes_read: int = 0
    bytes_communicated: int = 0
    client_train_seconds: float = 0.0
    server_seconds: float = 0.0
    evaluation_seconds: float = 0.0
    diagnostic_seconds: float = 0.0

    @property
    def elapsed_seconds(self) -> float:
        """Everything the run took: the method's wall time, its evaluation and diagnostics."""
        return self.wall_seconds + self.evaluation_seconds + self.diagnostic_seconds

    def to_dict(self) -> dict[str, Any]:
        """Return the ledger as a JSON-ready dict."""
        return asdict(self)


_COUNTERS = tuple(f.name for f in fields(Costs) if f.type == "int")
_TIMERS = ("client_train_seconds", "evaluation_seconds")  # what the meter times


class CostMeter:
    """The running ``Costs`` of one method run (its counters and timers).

    ``costs`` is the record so far; ``add`` adds to its counters, ``timed`` to its timers. A
    diagnostic whose work is not a cost (e.g. a reference retraining) runs under
    ``diagnostic()``, which puts the record back and keeps only its time.
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

    @contextmanager
    def timed(self, timer: str) -> Iterator[None]:
        """Add the wall time of the ``with`` block to ``timer`` (``client_train_seconds``, ...).

        Raises:
            ValueError: for a name that is not a timer of the meter.
        """
        if timer not in _TIMERS:
            raise ValueError(f"not a cost timer: {timer}; timers: {_TIMERS}")
        began = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - began
            self.costs = replace(self.costs, **{timer: getattr(self.costs, timer) + seconds})

    @contextmanager
    def diagnostic(self) -> Iterator[Costs]:
        """Run a diagnostic: yield the record before it; then put it back, adding only its time.

        What the block costs (client epochs, reads, timers) is not the method's; the block's
        wall time goes to ``diagnostic_seconds`` (outside the method's ``wall_seconds``).
        """
        saved = self.costs
        began = time.perf_counter()
        try:
            yield saved
        finally:
            seconds = time.perf_counter() - began
            self.costs = replace(saved, diagnostic_seconds=saved.diagnostic_seconds + seconds)

    def counts(self) -> dict[str, int]:
        """Return the counters as a dict (no times)."""
        return {name: getattr(self.costs, name) for name in _COUNTERS}

    def finish(self, elapsed: float) -> Costs:
        """Return the record of a method run that took ``elapsed`` seconds in all.

        Its wall time is ``elapsed`` less the evaluation and diagnostics; its server time the
        wall time less the client training (never below zero).
        """
        c = self.costs
        wall = max(elapsed - c.evaluation_seconds - c.diagnostic_seconds, 0.0)
        server = max(wall - c.client_train_seconds, 0.0)
        return replace(c, wall_seconds=wall, server_seconds=server)
