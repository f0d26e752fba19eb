"""Rule 4, ``poisoning``: a non-backdoor poisoning's damage is gone (accuracy near Retrain's).

Measure: test accuracy, when a forgotten client ran ``label_flip``, ``trim_random`` or
``fang_trim`` (their influence is the accuracy they cost).
Grade: the drop below Retrain's accuracy (never the poisoned original's) against
``utility_warn`` / ``utility_fail``; the original must fail, else ``inconclusive``; without
Retrain ``inconclusive``. A model less trained than every reference is flagged only below every
clean, less trained model too (``fitness``), else a flag is a warning.
"""

from __future__ import annotations

from fedunlearn.eval.receipt.controls import with_controls
from fedunlearn.eval.receipt.evidence import Evidence, Row, num
from fedunlearn.eval.receipt.finding import Finding, Rule, grade
from fedunlearn.eval.receipt.fitness import ceiling, path_rounds
from fedunlearn.eval.receipt.intervals import wilson
from fedunlearn.eval.receipt.thresholds import VerificationThresholds
from fedunlearn.unlearn.receipt import Verdict

__all__ = ["RULE"]


def applies(ev: Evidence) -> Finding | None:
    """n/a without a forgotten poisoner; inconclusive without Retrain (no clean accuracy)."""
    if not ev.attack.poisoning:
        return Finding("n/a", ("no_poisoning",))
    acc = num(ev.row.get("test_accuracy"))
    original = num(ev.controls.original.get("test_accuracy"))
    retrain = ev.controls.retrain
    if (
        retrain is None
        or num(retrain.get("test_accuracy")) is None
        or acc is None
        or original is None
    ):
        facts = {"attack": ev.attack.kind}
        return Finding("inconclusive", ("no_retrain",), acc, {"original": original}, facts=facts)
    return None


def judge(ev: Evidence, th: VerificationThresholds) -> Finding:
    """Grade the accuracy drop below Retrain, under the controls and the clean path."""
    assert ev.controls.retrain is not None
    acc = float(ev.row["test_accuracy"])
    original = float(ev.controls.original["test_accuracy"])
    retrain = float(ev.controls.retrain["test_accuracy"])

    def grade_row(row: Row) -> Verdict:
        value = num(row.get("test_accuracy"))
        return "pass" if value is None else grade(retrain - value, th.utility_warn, th.utility_fail)

    controls = {label: grade_row(row) for label, row in ev.controls.negatives().items()}
    graded = with_controls(grade_row(ev.row), controls, None)
    reference: dict[str, object] = {"original": original, "retrain": retrain}
    clean = ceiling(ev, "test_accuracy", higher_worse=False)
    if clean.applies and clean.clean:
        reference["clean_path"] = dict(clean.clean)
    line = clean.fail_line(retrain - th.utility_fail, th.utility_fail)
    verdict = graded.verdict
    demoted = clean.demoted(verdict, acc, retrain, th.utility_fail)
    if demoted:
        verdict = "warn"
    codes = [graded.why or {"fail": "survives", "pass": "pass", "warn": "partly"}[verdict]]
    if demoted:
        codes.append("less_trained_demoted" if clean.clean else "less_trained_unmeasured")
    power = {
        "original_flagged": graded.original_flagged,
        "controls": graded.controls,
        "separation_points": 100 * (retrain - original),
        "less_trained": clean.applies,
    }
    facts = {
        "acc": acc,
        "retrain": retrain,
        "original": original,
        "unflagged": graded.unflagged[0] if graded.unflagged else "",
        "path": path_rounds(clean.clean) if clean.clean else "",
        "path_top": clean.top,
    }
    threshold = {"warn": retrain - th.utility_warn, "fail": line}
    evidence = {"interval": wilson(acc, ev.row.get("test_samples"))}
    return Finding(verdict, tuple(codes), acc, reference, threshold, evidence, power, facts)


RULE = Rule("poisoning", "poisoning removed", judge, applies)
