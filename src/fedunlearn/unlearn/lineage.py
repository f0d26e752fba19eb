"""What an unlearned model was computed from: the evidence "by construction" of a receipt.

A method's ``UnlearnContext`` logs every stored payload and model the method read and the model it
started from; ``Lineage`` is the summary the result carries (``UnlearnResult.lineage``) and the
receipt states. ``exact`` means the result cannot depend on the forgotten clients: no update of
theirs, and no aggregate or global model from their first aggregated round on, was read, and the
start model precedes that round (Retrain; Crab's participation rollback followed only by the
remaining clients' fresh training). ``approximate`` means it read something that carries their
influence (``reads`` says what), so removal must be shown by a check with power. A model audited
without a result (``fedunlearn audit --model`` of a foreign file) has no lineage (``None``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Lineage", "LineageKind"]

LineageKind = Literal["exact", "approximate"]


@dataclass(frozen=True)
class Lineage:
    """What a result depended on.

    Args:
        kind: ``exact`` (no read carries the forgotten clients' influence) or ``approximate``.
        start: The model the method started from, in words ("global model of round 7",
            "initial model M_0", "final model M_T").
        start_round: Its round (0 = M_0; None when it was not a stored global model).
        first_tainted_round: The first round in which any forgotten client was aggregated
            (None when none ever was): stored aggregates and global models from this round on
            carry their influence.
        tainted_reads: The reads that carry the forgotten clients' influence, as
            ``{"updates": [[round, client], ...], "aggregates": [round, ...],
            "models": [round, ...]}`` (empty lists when exact).
        reason: One sentence a user can read.
    """

    kind: LineageKind
    start: str
    start_round: int | None
    first_tainted_round: int | None
    tainted_reads: dict[str, list[Any]] = field(default_factory=dict)
    reason: str = ""

    @property
    def exact(self) -> bool:
        """Whether the result provably does not depend on the forgotten clients."""
        return self.kind == "exact"

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {
            "kind": self.kind,
            "start": self.start,
            "start_round": self.start_round,
            "first_tainted_round": self.first_tainted_round,
            "tainted_reads": {k: list(v) for k, v in self.tainted_reads.items()},
            "reason": self.reason,
        }
