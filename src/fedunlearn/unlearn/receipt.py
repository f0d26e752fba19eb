"""The receipt of an unlearning result: checks with verdicts, and a method's certified bound.

A ``Verification`` is what verifying one model against one request found: a tuple of ``Check``
values (each a measured value, the reference it was judged against, the threshold and a verdict
``pass``, ``warn``, ``fail`` or ``n/a``, with one sentence saying why whenever it is not a pass),
and the overall verdict (``fail`` if any check fails, else ``warn`` if any warns, else ``pass``).
These are plain frozen values so that ``UnlearnResult`` can carry one; the checks themselves are
computed in ``fedunlearn.eval`` (above this layer), and ``docs/verification.md`` documents them.

``BoundReport`` is how a method states a certified bound on its own distance to a retrained
model (Crab's Theorem 1, Starfish's Theorem 1): ``Details.certified_bound()`` returns one, or
None when the method certifies nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from fedunlearn.errors import ConfigError

__all__ = ["VERDICTS", "BoundReport", "Check", "Verdict", "Verification", "overall_verdict"]

Verdict = Literal["pass", "warn", "fail", "n/a"]
VERDICTS: tuple[str, ...] = ("pass", "warn", "fail", "n/a")
_SEVERITY = {"n/a": 0, "pass": 1, "warn": 2, "fail": 3}


def _json_number(value: Any) -> Any:
    """Return ``value`` with non-finite floats as None (JSON has no NaN or inf)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_number(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_number(v) for v in value]
    return value


@dataclass(frozen=True)
class BoundReport:
    """A certified upper bound on the distance between a method's model and a retrained model.

    Attributes:
        name: What the bound is, e.g. ``"Crab Theorem 1 (B_safe)"``.
        bound: The bound's value (same units as ``observed``: L2 distance of flat parameters).
        observed: The distance the bound is about, measured by the method against the model the
            theorem compares with; None if the method did not measure it (the receipt then uses
            the distance to Retrain when ``reference`` is ``"retrain"`` and one is available).
        reference: The model the distance is to, in words (``"retrain"`` for the full Retrain).
        note: Assumptions worth knowing (e.g. "convexity assumed; illustrative on an MLP").
    """

    name: str
    bound: float
    observed: float | None = None
    reference: str = "retrain"
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return _json_number(
            {
                "name": self.name,
                "bound": self.bound,
                "observed": self.observed,
                "reference": self.reference,
                "note": self.note,
            }
        )


@dataclass(frozen=True)
class Check:
    """One check of a receipt.

    Attributes:
        name: Stable key (``backdoor``, ``membership``, ``distance``, ``bound``, ``utility``,
            ``deletion``, ``method_warnings``).
        title: Short human title.
        verdict: ``pass``, ``warn``, ``fail`` or ``n/a``.
        value: The measured value the verdict is based on (None for ``n/a``).
        reference: The value(s) it is judged against, by name (``{"original": .., "retrain": ..}``).
        threshold: The thresholds applied, by name (``{"warn": .., "fail": ..}``).
        reason: One sentence saying why, for every verdict other than ``pass`` (and a short
            statement for a pass).
        scope: ``model`` (a property of the judged model) or ``store`` (of the run's history
            store, the same for every model of a request).
        evidence: Further measured numbers (per attack, per client, ...).
    """

    name: str
    title: str
    verdict: Verdict
    value: float | None = None
    reference: dict[str, Any] = field(default_factory=dict)
    threshold: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    scope: Literal["model", "store"] = "model"
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ConfigError(f"verdict must be one of {', '.join(VERDICTS)}; got {self.verdict!r}")

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return _json_number(
            {
                "name": self.name,
                "title": self.title,
                "verdict": self.verdict,
                "value": self.value,
                "reference": dict(self.reference),
                "threshold": dict(self.threshold),
                "reason": self.reason,
                "scope": self.scope,
                "evidence": dict(self.evidence),
            }
        )


def overall_verdict(checks: tuple[Check, ...] | list[Check]) -> Verdict:
    """Return ``fail`` if a check fails, else ``warn`` if one warns, else ``pass``."""
    worst = max((_SEVERITY[c.verdict] for c in checks), default=0)
    return "fail" if worst == 3 else "warn" if worst == 2 else "pass"


@dataclass(frozen=True)
class Verification:
    """What verifying one model against one request found (the receipt).

    Attributes:
        checks: Every check, in a fixed order (n/a ones included, with the reason).
        references: The reference models the checks used (``original``, and ``retrain`` when
            one was computed or given).
        thresholds: The thresholds in force (``VerificationThresholds`` as a dict).
        subject: What was judged (a method name, or the model file of an audit).
    """

    checks: tuple[Check, ...]
    references: tuple[str, ...] = ("original",)
    thresholds: dict[str, Any] = field(default_factory=dict)
    subject: str = ""

    @property
    def verdict(self) -> Verdict:
        """Overall verdict over every check (store checks included)."""
        return overall_verdict(self.checks)

    @property
    def model_verdict(self) -> Verdict:
        """Overall verdict over the checks of the model alone (``scope == "model"``)."""
        return overall_verdict([c for c in self.checks if c.scope == "model"])

    @property
    def reasons(self) -> tuple[str, ...]:
        """One sentence per warning or failing check, failures first."""
        bad = [c for c in self.checks if c.verdict in ("fail", "warn")]
        bad.sort(key=lambda c: -_SEVERITY[c.verdict])
        return tuple(f"{c.title}: {c.reason}" for c in bad)

    def check(self, name: str) -> Check:
        """Return the check called ``name``.

        Raises:
            KeyError: if there is no such check.
        """
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no check {name!r}; checks: {', '.join(c.name for c in self.checks)}")

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON block (``docs/results_format.md``, "verification")."""
        return {
            "verdict": self.verdict,
            "model_verdict": self.model_verdict,
            "subject": self.subject,
            "reasons": list(self.reasons),
            "references": list(self.references),
            "checks": [c.to_dict() for c in self.checks],
            "thresholds": _json_number(dict(self.thresholds)),
        }
