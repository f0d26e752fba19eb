"""Rule 1, ``backdoor``: the backdoor no longer works (ASR near a clean reference's).

Measure: the backdoor ASR on triggered non-target test inputs (``row["backdoor_asr"]``).
Grade: the excess over Retrain's ASR, else over the ASR measured on M_0 when every attacker is
forgotten: ``<= backdoor_warn`` pass, ``<= backdoor_fail`` warn, above fail. The original (and
with noise) must fail and Retrain must not (``with_controls``). Off the references' ground the
fail line rises to the clean models there (``fitness``). With honest clients in the request a
pass is not decisive (the ASR says nothing about them).
"""

from __future__ import annotations

from fedunlearn.eval.receipt.controls import with_controls
from fedunlearn.eval.receipt.evidence import Evidence, Row, num
from fedunlearn.eval.receipt.finding import Finding, Rule, grade
from fedunlearn.eval.receipt.fitness import ceiling, path_rounds
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


def judge(ev: Evidence, th: VerificationThresholds) -> Finding:
    """Grade the ASR against the clean reference, under the controls and the clean path."""
    asr = float(ev.row["backdoor_asr"])
    original = float(ev.controls.original["backdoor_asr"])
    base, base_name = _reference(ev)
    assert base is not None  # applies() returned None
    reference: dict[str, object] = {"original": original, "retrain": None}
    if ev.controls.retrain is not None:
        reference["retrain"] = base
    else:
        reference["clean_measured"] = base
    clean = ceiling(ev, "backdoor_asr")
    if clean.applies and clean.clean:  # a pass still needs the reference's ASR
        reference["clean_path"] = dict(clean.clean)
    line = clean.fail_line(base + th.backdoor_fail, th.backdoor_fail)

    def grade_row(row: Row) -> Verdict:
        value = num(row.get("backdoor_asr"))
        return "pass" if value is None else grade(value - base, th.backdoor_warn, th.backdoor_fail)

    controls = {label: grade_row(row) for label, row in ev.controls.negatives().items()}
    positive = grade_row(ev.controls.retrain) if ev.controls.retrain is not None else None
    graded = with_controls(grade_row(ev.row), controls, positive)
    verdict = graded.verdict
    demoted = clean.demoted(verdict, asr, base, th.backdoor_fail)
    if demoted:
        verdict = "warn"
    codes = [graded.why or _MAIN[verdict]]
    if demoted:
        codes.append("less_trained_demoted" if clean.clean else "less_trained_unmeasured")
    elif clean.applies and clean.clean and verdict == "fail":
        codes.append("less_trained_beyond")
    honest = ev.attack.honest_forgotten
    if honest > 0 and verdict == "pass":
        codes.append("honest_not_covered")
    evidence = {
        "asr_forgotten_data": num(ev.row.get("backdoor_asr_forgotten")),
        "original_asr_forgotten_data": num(ev.controls.original.get("backdoor_asr_forgotten")),
    }
    if original - base > 0:
        evidence["share_removed"] = (original - asr) / (original - base)
    power = {
        "original_flagged": graded.original_flagged,
        "controls": graded.controls,
        "separation_points": 100 * (original - base),
        "fail_line_points": 100 * th.backdoor_fail,
        "less_trained": clean.applies,
    }
    facts = {
        "asr": asr,
        "base": base,
        "base_name": base_name,
        "original": original,
        "fail_line": base + th.backdoor_fail,
        "unflagged": graded.unflagged[0] if graded.unflagged else "",
        "honest": honest,
        "path": path_rounds(clean.clean) if clean.clean else "",
        "path_top": clean.top,
    }
    threshold = {"warn": base + th.backdoor_warn, "fail": line}
    return Finding(
        verdict,
        tuple(codes),
        asr,
        reference,
        threshold,
        evidence,
        power,
        facts,
        decisive=honest <= 0,
    )


RULE = Rule("backdoor", "backdoor removed", judge, applies)
