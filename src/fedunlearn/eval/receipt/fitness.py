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

The backdoor, markers and poisoning rules wrap their grade with ``ceiling`` and ``demoted``;
the client-level rule reads the same ``less_trained``.
"""

from __future__ import annotations

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


def path_rounds(labels: object) -> str:
    """``clean_round_<t>`` labels as "Retrain's rounds 1, 5, 10"."""
    rounds = sorted(int(str(label).rsplit("_", 1)[1]) for label in labels)  # type: ignore[attr-defined]
    return "Retrain's rounds " + ", ".join(str(t) for t in rounds)


@dataclass(frozen=True)
class Ceiling:
    """The clean models that raise a candidate's fail line, if it is off the references' ground.

    Attributes:
        applies: The candidate is less trained than every reference.
        clean: The clean, less trained models' values, by label (empty: none measured).
        higher_worse: Whether a higher value is worse (ASR, marker rate; accuracy: False).
    """

    applies: bool
    clean: dict[str, float] = field(default_factory=dict)
    higher_worse: bool = True

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
        if top is None:
            return True
        sign = 1.0 if self.higher_worse else -1.0
        return sign * top > sign * base and sign * (value - top) <= margin


def ceiling(ev: Evidence, key: str, *, higher_worse: bool = True) -> Ceiling:
    """The ceiling of ``key`` (a row key: ``backdoor_asr``, ``test_accuracy``) for the candidate."""
    if not less_trained(ev):
        return Ceiling(False, higher_worse=higher_worse)
    clean = ev.controls.values(ev.controls.clean_less, key)
    return Ceiling(True, clean, higher_worse)
