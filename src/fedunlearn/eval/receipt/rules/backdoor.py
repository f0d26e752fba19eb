"""Rule 1, ``backdoor``: the backdoor no longer works (ASR near a clean reference's).

Measure: the backdoor ASR on triggered non-target test inputs (``row["backdoor_asr"]``).
Grade: the excess over Retrain's ASR, else over the ASR measured on M_0 when every attacker is
forgotten: ``<= backdoor_warn`` pass, ``<= backdoor_fail`` warn, above fail. The original (and
with noise) must fail and Retrain must not (``with_controls``). The fail line rises to the
clean models the candidate meets (``fitness.ceiling``): Retrain's earlier rounds for a model
less trained than every reference, and, while other attackers stay in the federation (their
backdoor grows with training), Retrain continued 1-5 rounds by the remaining clients. With
honest clients in the request a pass is not decisive (the ASR says nothing about them).
"""

from __future__ import annotations

from typing import Any

from fedunlearn.eval.receipt.controls import Graded, with_controls
from fedunlearn.eval.receipt.evidence import Evidence, Row, num
from fedunlearn.eval.receipt.finding import Finding, Rule, grade
from fedunlearn.eval.receipt.fitness import Ceiling, ceiling, path_rounds
from fedunlearn.eval.receipt.intervals import wilson
from fedunlearn.eval.receipt.thresholds import VerificationThresholds
from fedunlearn.unlearn.receipt import Verdict

__all__ = ["RULE"]

_MAIN = {"fail": "survives", "pass": "pass", "warn": "partly"}


def _reference(ev: Evidence) -> tuple[float | None, str]:
    """Retrain's ASR, else M_0's when every attacker is forgotten, with its name."""
    retrain = ev.controls.retrain
    if retrain is not None:
        return num(retrain.get("backdoor_asr")), "Retrain"
    if ev.attack.attackers_remain:
        return None, ""
    return ev.controls.clean_asr, "the untrained initial model M_0"


def applies(ev: Evidence) -> Finding | None:
    """n/a without a backdoor or a forgotten attacker; inconclusive without a clean reference."""
    if not ev.attack.backdoor:
        return Finding("n/a", ("no_backdoor",))
    if ev.attack.attackers_forgotten == 0:
        return Finding("n/a", ("no_attacker_forgotten",))
    asr = num(ev.row.get("backdoor_asr"))
    original = num(ev.controls.original.get("backdoor_asr"))
    if asr is None or original is None:
        return Finding("inconclusive", ("not_measured",))
    base, _ = _reference(ev)
    if base is not None:
        return None
    others = ev.attack.attackers_total - ev.attack.attackers_forgotten
    code = "others_remain" if ev.controls.retrain is None and others > 0 else "no_clean_asr"
    facts = {"others": others, "asr": asr, "original": original}
    return Finding("inconclusive", (code,), asr, {"original": original}, facts=facts)


def _graded(ev: Evidence, base: float, th: VerificationThresholds) -> Graded:
    def grade_row(row: Row) -> Verdict:
        value = num(row.get("backdoor_asr"))
        return "pass" if value is None else grade(value - base, th.backdoor_warn, th.backdoor_fail)

    controls = {label: grade_row(row) for label, row in ev.controls.negatives().items()}
    positive = grade_row(ev.controls.retrain) if ev.controls.retrain is not None else None
    return with_controls(grade_row(ev.row), controls, positive)


def _codes(ev: Evidence, graded: Graded, verdict: Verdict, clean: Ceiling, demoted: bool) -> tuple:
    """The main code, then why a flag is (or is not) only a warning, then the honest clients."""
    codes = [graded.why or _MAIN[verdict]]
    side = "less_trained" if clean.side.startswith("less") else "others_grow"
    if demoted:
        codes.append(f"{side}_unmeasured" if clean.missing else f"{side}_demoted")
    elif clean.applies and clean.clean and verdict == "fail":
        codes.append(f"{side}_beyond")
    if ev.attack.honest_forgotten > 0 and verdict == "pass":
        codes.append("honest_not_covered")
    return tuple(codes)


def judge(ev: Evidence, th: VerificationThresholds) -> Finding:
    """Grade the ASR against the clean reference, under the controls and the clean models."""
    asr = float(ev.row["backdoor_asr"])
    original = float(ev.controls.original["backdoor_asr"])
    base, base_name = _reference(ev)
    assert base is not None  # applies() returned None
    has_retrain = ev.controls.retrain is not None
    reference: dict[str, Any] = {"original": original, "retrain": base if has_retrain else None}
    if not has_retrain:
        reference["clean_measured"] = base
    clean = ceiling(ev, "backdoor_asr", more=has_retrain and ev.attack.attackers_remain)
    if clean.applies and clean.clean:  # a pass still needs the reference's ASR
        reference["clean_path"] = dict(clean.clean)
    graded = _graded(ev, base, th)
    demoted = clean.demoted(graded.verdict, asr, base, th.backdoor_fail)
    verdict: Verdict = "warn" if demoted else graded.verdict
    evidence: dict[str, Any] = {
        "asr_forgotten_data": num(ev.row.get("backdoor_asr_forgotten")),
        "original_asr_forgotten_data": num(ev.controls.original.get("backdoor_asr_forgotten")),
    }
    if original - base > 0:
        evidence["share_removed"] = (original - asr) / (original - base)
    evidence["interval"] = wilson(asr, ev.row.get("backdoor_samples"))
    power = {
        "original_flagged": graded.original_flagged,
        "controls": graded.controls,
        "separation_points": 100 * (original - base),
        "fail_line_points": 100 * th.backdoor_fail,
        "less_trained": "less" in clean.side,
        "clean_side": clean.side,
    }
    facts = {
        "asr": asr,
        "base": base,
        "base_name": base_name,
        "original": original,
        "fail_line": base + th.backdoor_fail,
        "unflagged": graded.unflagged[0] if graded.unflagged else "",
        "honest": ev.attack.honest_forgotten,
        "path": path_rounds(clean.clean),
        "path_top": clean.top,
    }
    line = clean.fail_line(base + th.backdoor_fail, th.backdoor_fail)
    threshold = {"warn": base + th.backdoor_warn, "fail": line}
    codes = _codes(ev, graded, verdict, clean, demoted)
    decisive = ev.attack.honest_forgotten <= 0
    return Finding(verdict, codes, asr, reference, threshold, evidence, power, facts, decisive)


RULE = Rule("backdoor", "backdoor removed", judge, applies)
