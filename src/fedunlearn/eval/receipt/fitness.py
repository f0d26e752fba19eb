"""The clean-path rule, written once: a model trained unlike the references meets clean ones.

A check's line is drawn for models trained as the run was. A model less trained than every
reference of the client-level test (its fitness below their range) is off that ground: an
under-trained clean model can send triggered inputs to the target class, hit a marker's target
or lose accuracy without any poisoning (measured on the reduced MNIST CNN: Retrain stopped at
half the rounds). Such a model is compared with the clean models as little trained that the
receipt measured, Retrain's own earlier global models (``Controls.clean_less``): it is flagged
only beyond every one of them, and a flag short of that is ``warn`` (not cleared, never
``remains``); without them every flag on it is ``warn``. The clean models raise the fail line
only: a pass still needs Retrain's level.

The same holds on the other side for the backdoor: while other attackers stay in the
federation, their backdoor grows with every round a clean model trains, and a clean model
trained more than Retrain (Retrain continued 1 to 5 rounds by the remaining clients,
``Controls.clean_more``) can exceed Retrain's ASR by more than the fail margin; a flag then
needs every one of them below it too (``ceiling(..., more=True)``), and without them it is a
warning.

The backdoor, markers and poisoning rules wrap their grade with ``ceiling`` and ``demoted``;
the client-level rule reads the same ``less_trained``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from fedunlearn.eval.receipt.evidence import Evidence
from fedunlearn.unlearn.receipt import Verdict

__all__ = ["Ceiling", "ceiling", "less_trained", "path_rounds"]


def less_trained(ev: Evidence) -> bool:
    """Whether the model is less trained than every reference of the client-level test.

    Unknown (no client-level test, no measured range): False.
    """
    cm = ev.client_membership
    return cm is not None and cm.region("candidate") == "below"


def path_rounds(labels: Iterable[str]) -> str:
    """Clean models' labels in words: "Retrain's rounds 1, 5; Retrain + 1, 2 rounds".

    ``clean_round_<t>``: Retrain's global model after round t; ``retrain_continued_<k>``:
    Retrain continued k rounds.
    """
    earlier = sorted(int(x.rsplit("_", 1)[1]) for x in labels if x.startswith("clean_round_"))
    later = sorted(int(x.rsplit("_", 1)[1]) for x in labels if x.startswith("retrain_continued_"))
    parts = []
    if earlier:
        parts.append("Retrain's rounds " + ", ".join(str(t) for t in earlier))
    if later:
        parts.append("Retrain + " + ", ".join(str(k) for k in later) + " rounds")
    return "; ".join(parts)


@dataclass(frozen=True)
class Ceiling:
    """The clean models that raise a candidate's fail line, when it is off the references' ground.

    Attributes:
        side: Why the clean models apply: ``less`` (the candidate is less trained than every
            reference), ``more`` (attackers remain and training grows their backdoor), both
            (``less+more``) or ``""`` (none: the line stays).
        clean: Their values, by label (empty: none measured).
        higher_worse: Whether a higher value is worse (ASR, marker rate; accuracy: False).
        missing: A side applies but none of its clean models was measured (every flag is
            then a warning).
    """

    side: str
    clean: dict[str, float] = field(default_factory=dict)
    higher_worse: bool = True
    missing: bool = False

    @property
    def applies(self) -> bool:
        """Whether the candidate meets clean models here."""
        return bool(self.side)

    @property
    def top(self) -> float | None:
        """The worst clean value (highest, or lowest when lower is worse), or None."""
        if not self.clean:
            return None
        pick = max if self.higher_worse else min
        return pick(self.clean.values())

    def fail_line(self, line: float, margin: float) -> float:
        """``line`` moved beyond the worst clean value plus ``margin`` (never closer)."""
        top = self.top
        if not self.applies or top is None:
            return line
        if self.higher_worse:
            return max(line, top + margin)
        return min(line, top - margin)

    def demoted(self, verdict: Verdict, value: float, base: float, margin: float) -> bool:
        """Whether a ``fail`` of ``value`` (reference ``base``) is only a ``warn`` here.

        It is when the candidate is off the ground and no clean model was measured, or a
        clean one is worse than the reference and the candidate is not beyond it by more than
        ``margin``.
        """
        if not self.applies or verdict != "fail":
            return False
        top = self.top
        if top is None or self.missing:
            return True
        sign = 1.0 if self.higher_worse else -1.0
        return sign * top > sign * base and sign * (value - top) <= margin


def ceiling(ev: Evidence, key: str, *, higher_worse: bool = True, more: bool = False) -> Ceiling:
    """The ceiling of ``key`` (a row key: ``backdoor_asr``, ``test_accuracy``) for the candidate.

    Args:
        ev: The evidence.
        key: The row key compared.
        higher_worse: Whether a higher value is worse.
        more: Also meet the clean models trained more than Retrain (``clean_more``), whatever
            the candidate's fitness.
    """
    sides, clean, missing = [], {}, False
    for side, on, rows in (
        ("less", less_trained(ev), ev.controls.clean_less),
        ("more", more, ev.controls.clean_more),
    ):
        if on:
            sides.append(side)
            found = ev.controls.values(rows, key)
            missing = missing or not found
            clean.update(found)
    return Ceiling("+".join(sides), clean, higher_worse, missing)
