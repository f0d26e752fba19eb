"""Rule 7, ``utility``: test accuracy stays near Retrain's (or the original's, if not poisoned).

Measure: test accuracy. Grade: the drop below Retrain's accuracy, else below the original's
(n/a when the original is poisoned by label flip, trim or Fang), against ``utility_warn`` /
``utility_fail``.
"""

from __future__ import annotations

from fedunlearn.eval.receipt.evidence import Evidence, num
from fedunlearn.eval.receipt.finding import Finding, Rule, grade
from fedunlearn.eval.receipt.intervals import wilson
from fedunlearn.eval.receipt.thresholds import VerificationThresholds

__all__ = ["RULE"]


def _base(ev: Evidence) -> tuple[float | None, str]:
    retrain = ev.controls.retrain
    if retrain is not None and num(retrain.get("test_accuracy")) is not None:
        return num(retrain.get("test_accuracy")), "Retrain"
    return num(ev.controls.original.get("test_accuracy")), "the original"


def applies(ev: Evidence) -> Finding | None:
    """n/a against a poisoned original, or when accuracy was not measured."""
    acc = num(ev.row.get("test_accuracy"))
    original = num(ev.controls.original.get("test_accuracy"))
    base, name = _base(ev)
    if name == "the original" and ev.attack.poisoning:
        facts = {"attack": ev.attack.kind}
        return Finding("n/a", ("poisoned_original",), acc, {"original": original}, facts=facts)
    if acc is None or base is None:
        return Finding("n/a", ("not_measured",))
    return None


def judge(ev: Evidence, th: VerificationThresholds) -> Finding:
    """Grade the accuracy drop below the reference."""
    acc = float(ev.row["test_accuracy"])
    base, name = _base(ev)
    assert base is not None
    retrain = num(ev.controls.retrain.get("test_accuracy")) if ev.controls.retrain else None
    reference = {"original": num(ev.controls.original.get("test_accuracy")), "retrain": retrain}
    threshold = {"warn": base - th.utility_warn, "fail": base - th.utility_fail}
    verdict = grade(base - acc, th.utility_warn, th.utility_fail)
    codes = ["pass" if verdict == "pass" else "drop"]
    if ev.attack.private_run and retrain is not None:
        codes.append("dp_reference" if ev.controls.private_reference else "dp_noise_free")
    facts = {"acc": acc, "base": base, "base_name": name, "drop_points": 100 * (base - acc)}
    evidence = {"interval": wilson(acc, ev.row.get("test_samples"))}
    return Finding(verdict, tuple(codes), acc, reference, threshold, evidence, facts=facts)


RULE = Rule("utility", "utility", judge, applies, aspect="utility")
