"""Rule 9, ``method_warnings`` (method): the method raised no warning about its own result.

Each sentence of the method's ``details.warnings`` makes the rule ``method_warning`` (warn);
none: pass; n/a in an audit without the result file.
"""

from __future__ import annotations

from fedunlearn.eval.receipt.evidence import Evidence
from fedunlearn.eval.receipt.finding import Finding, Rule
from fedunlearn.eval.receipt.thresholds import VerificationThresholds

__all__ = ["RULE"]


def applies(ev: Evidence) -> Finding | None:
    """n/a when the method's warnings were not available."""
    return None if ev.claims.warnings_available else Finding("n/a", ("unavailable",))


def judge(ev: Evidence, th: VerificationThresholds) -> Finding:
    """Each warning of the method is a warning of the receipt."""
    warnings = ev.claims.warnings
    if not warnings:
        return Finding("pass", ("none",), 0.0)
    facts = {"warnings": [s.rstrip(".") for s in warnings]}
    evidence = {"warnings": list(warnings)}
    return Finding(
        th.method_warning, ("warned",), float(len(warnings)), evidence=evidence, facts=facts
    )


RULE = Rule("method_warnings", "method warnings", judge, applies, aspect="method")
