"""No pass without power: the candidate graded beside its controls, by the same rule.

Every statistical rule grades its negative controls (the original model, which carries the
forgotten clients' influence, and the original plus small noise) and its positive control
(Retrain) with the rule that grades the candidate. ``with_controls`` then decides, the same way
for every rule: a flagged candidate stays ``fail`` (the threshold bounds false flags); otherwise
every negative control must be flagged and the positive control must not be, or the verdict is
``inconclusive`` (code ``no_power``, or ``flags_retrain``), never ``pass``.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedunlearn.unlearn.receipt import Verdict

__all__ = ["Graded", "with_controls"]


@dataclass(frozen=True)
class Graded:
    """The candidate's verdict under its controls.

    Attributes:
        verdict: After the controls.
        candidate: The candidate's own grade.
        controls: Each negative control's grade, by label.
        unflagged: The negative controls that were not flagged (the rule has no power).
        positive_flagged: Whether the positive control (Retrain) was flagged.
    """

    verdict: Verdict
    candidate: Verdict
    controls: dict[str, Verdict]
    unflagged: list[str]
    positive_flagged: bool

    @property
    def original_flagged(self) -> bool:
        """Whether the original (the first negative control) was flagged."""
        return self.controls.get("original") == "fail"

    @property
    def why(self) -> str | None:
        """The code of an ``inconclusive`` verdict: ``no_power`` or ``flags_retrain``."""
        if self.verdict != "inconclusive":
            return None
        return "no_power" if self.unflagged else "flags_retrain"


def with_controls(
    candidate: Verdict, controls: dict[str, Verdict], positive: Verdict | None
) -> Graded:
    """Return the candidate's verdict under its negative and positive controls."""
    unflagged = [label for label, v in controls.items() if v != "fail"]
    positive_flagged = positive == "fail"
    verdict = candidate
    if candidate != "fail" and (unflagged or positive_flagged):
        verdict = "inconclusive"
    return Graded(verdict, candidate, dict(controls), unflagged, positive_flagged)
