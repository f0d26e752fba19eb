"""A rule's finding (a value: verdict, numbers, codes) and the rule itself (name, aspect, steps).

Every rule of the receipt is a ``Rule``: ``applies(ev)`` decides, before any grading, whether
the rule can say anything (a ``Finding`` with verdict ``n/a`` or ``inconclusive`` and the code
why, or None), and ``judge(ev, th)`` grades the candidate and its controls into a ``Finding``.
A finding carries no prose: its ``codes`` say why, its ``facts`` hold the numbers the wording
quotes (``wording.explain`` renders both into the check's sentence, in one place).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from fedunlearn.unlearn.receipt import Verdict

if TYPE_CHECKING:
    from fedunlearn.eval.receipt.evidence import Evidence
    from fedunlearn.eval.receipt.thresholds import VerificationThresholds

__all__ = ["SEVERITY", "Finding", "Rule", "grade", "worst"]

Aspect = Literal["influence", "utility", "store", "method"]
Scope = Literal["model", "store"]
SEVERITY = {"pass": 0, "warn": 1, "fail": 2}


def grade(excess: float, warn: float, fail: float) -> Verdict:
    """``pass`` at or below ``warn``, ``warn`` at or below ``fail``, else ``fail``."""
    return "pass" if excess <= warn else "warn" if excess <= fail else "fail"


def worst(verdicts: list[Verdict]) -> Verdict:
    """The most severe of ``pass``, ``warn``, ``fail`` (``pass`` for none)."""
    return max(verdicts, key=lambda v: SEVERITY[v], default="pass")


@dataclass(frozen=True)
class Finding:
    """What one rule found about one model.

    Attributes:
        verdict: ``pass``, ``warn``, ``fail``, ``inconclusive`` or ``n/a``.
        codes: Why, as stable codes (``survives``, ``no_power``, ...; the wording renders
            them in order).
        value: The measured value the verdict rests on.
        reference: The values it was judged against, by name.
        threshold: The lines applied, by name.
        evidence: Further measured numbers.
        power: The rule's measured power on its controls.
        facts: The numbers and names the wording quotes.
        decisive: Whether a pass can show removal (None: the rule's default).
    """

    verdict: Verdict
    codes: tuple[str, ...] = ()
    value: float | None = None
    reference: dict[str, Any] = field(default_factory=dict)
    threshold: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)
    power: dict[str, Any] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    decisive: bool | None = None


def _always(_ev: Evidence) -> Finding | None:
    return None


@dataclass(frozen=True)
class Rule:
    """One check of the receipt.

    Attributes:
        name: Stable key (``backdoor``, ``membership``, ...).
        title: Short human title.
        judge: Grades the candidate and its controls: ``(evidence, thresholds) -> Finding``.
        applies: Decides applicability first: a ``Finding`` (``n/a`` or ``inconclusive``)
            when the rule cannot judge, else None.
        aspect: The verdict the rule feeds: ``influence``, ``utility``, ``store``, ``method``.
        scope: ``model`` or ``store``.
        decisive: Whether its pass can show removal by itself.
    """

    name: str
    title: str
    judge: Callable[[Evidence, VerificationThresholds], Finding]
    applies: Callable[[Evidence], Finding | None] = _always
    aspect: Aspect = "influence"
    scope: Scope = "model"
    decisive: bool = True
