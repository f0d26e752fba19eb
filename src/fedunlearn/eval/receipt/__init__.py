"""The receipt as a rule set: measured evidence in, one finding per rule, one receipt out.

``build_verification(evidence, thresholds)`` runs every rule of ``RULES`` on one model's
``Evidence`` (``evidence.py``: the candidate's row, its controls, the request's attack, the
method's claims, the per-rule measurements) and returns a ``Verification``: one ``Check`` per
rule with its value, reference, lines, measured power, verdict, codes and sentence, plus the
separate influence, utility and store verdicts (``fedunlearn.unlearn.receipt``).

Each rule (``rules/``) decides in three steps kept apart: what it reads (frozen evidence), how
it grades (``Rule.applies`` then ``Rule.judge`` -> ``Finding``: a verdict, numbers, codes),
and what it says (``wording.explain``, the one place prose is written). What every statistical
rule shares is written once: the controls (``controls.with_controls``: no pass without power)
and the clean-path rule for models trained unlike the references (``fitness``).
docs/verification.md gives each rule's lines, controls and calibration.
"""

from __future__ import annotations

from fedunlearn.eval.receipt.evidence import Attack, Claims, Controls, Evidence
from fedunlearn.eval.receipt.finding import Finding, Rule
from fedunlearn.eval.receipt.rules import RULES
from fedunlearn.eval.receipt.rules.membership import auc_standard_error
from fedunlearn.eval.receipt.thresholds import VerificationThresholds
from fedunlearn.eval.receipt.wording import explain
from fedunlearn.unlearn.receipt import Check, Verification

__all__ = [
    "CHECK_NAMES",
    "RULES",
    "Attack",
    "Claims",
    "Controls",
    "Evidence",
    "Finding",
    "Rule",
    "VerificationThresholds",
    "auc_standard_error",
    "build_verification",
    "run_rule",
]

CHECK_NAMES = tuple(rule.name for rule in RULES)


def _without_control(rule: Rule, evidence: Evidence) -> Finding | None:
    """An influence rule has no negative control when the original lost the influence."""
    if rule.aspect == "influence" and not evidence.controls.original_carries:
        return Finding("inconclusive", ("no_control",))
    return None


def run_rule(rule: Rule, evidence: Evidence, thresholds: VerificationThresholds) -> Check:
    """Return the check of one rule: applicability, then the grade, then the sentence."""
    finding = (
        _without_control(rule, evidence)
        or rule.applies(evidence)
        or rule.judge(evidence, thresholds)
    )
    return Check(
        rule.name,
        rule.title,
        finding.verdict,
        finding.value,
        dict(finding.reference),
        dict(finding.threshold),
        explain(rule.name, finding, evidence.clients_text),
        rule.scope,
        dict(finding.evidence),
        rule.aspect,
        dict(finding.power),
        rule.decisive if finding.decisive is None else finding.decisive,
        codes=finding.codes,
    )


def build_verification(
    evidence: Evidence,
    thresholds: VerificationThresholds | None = None,
    *,
    subject: str = "",
) -> Verification:
    """Return the receipt of one model: every rule's check, in ``CHECK_NAMES`` order.

    Args:
        evidence: What was measured about the model and its references.
        thresholds: The thresholds (defaults if None).
        subject: What is judged (a method name, a model file).
    """
    th = thresholds or VerificationThresholds()
    checks = tuple(run_rule(rule, evidence, th) for rule in RULES)
    references = ("original", "retrain") if evidence.controls.retrain is not None else ("original",)
    lineage = evidence.claims.lineage.to_dict() if evidence.claims.lineage is not None else None
    return Verification(
        checks,
        references,
        th.model_dump(mode="json"),
        subject,
        lineage,
        assumptions=evidence.claims.assumptions,
    )
