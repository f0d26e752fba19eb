"""Rule 3, ``client_membership``: the client-level membership test no longer flags the model.

Measure: the test's score of the model (``ClientMembershipEvidence.scores["candidate"]``) and
its fitness (``fitness``, against the references' range, ``region``).
Grade: above the line the model faces (``client_lines.client_line``) ``fail``; below it ``pass``
if the original (and ``original*`` copies) is flagged at that line and at its own, and Retrain
(the positive control) is not at its own, else ``inconclusive``; a flag while Retrain is
flagged too is ``warn``. Off the references' range: less trained, a flag needs every "with"
reference and every clean, less trained model (Retrain's earlier rounds) below it, else
``warn`` above the calibrated threshold (never ``remains``) or ``inconclusive``; trained more,
a model not flagged is ``inconclusive``. A model not trained from the run's M_0 (farther from
every reference than their training displacement: region ``elsewhere``, e.g. a Retrain from
another initial model) or with a NaN score or fitness: ``inconclusive``.

Every finding names the test's null (``evidence["references"]``: ``per_request``, ``shared`` or
``held_out``); asked for the held-out null, it adds the code ``held_out_null`` (what that null
rests on: a test set never trained or tuned on, an honest exact Retrain as anchor, and whether
the caller gave that anchor) or ``held_out_fallback`` (why it did not apply, with
``evidence["held_out_fallback"]``).
"""

from __future__ import annotations

import math
from typing import Any

from fedunlearn.eval.mia.client import ClientMembershipEvidence
from fedunlearn.eval.receipt.controls import Graded, with_controls
from fedunlearn.eval.receipt.evidence import Evidence
from fedunlearn.eval.receipt.finding import Finding, Rule
from fedunlearn.eval.receipt.fitness import path_rounds
from fedunlearn.eval.receipt.intervals import mean_interval
from fedunlearn.eval.receipt.rules.client_lines import client_line, path_scores
from fedunlearn.eval.receipt.thresholds import VerificationThresholds
from fedunlearn.unlearn.receipt import NO_LIMIT_CODE, Verdict

__all__ = ["RULE"]


def applies(ev: Evidence) -> Finding | None:
    """n/a when the test was not run; inconclusive unless it scored the model and the original."""
    cm = ev.client_membership
    if cm is None:
        return Finding("n/a", ("not_run",))
    if cm.power is None:  # skipped, or out of time: no calibration
        why = str(cm.notes.get("inconclusive") or "no calibration")
        evidence, codes, facts = _null(cm)
        facts |= {"why": why}
        return Finding(
            "inconclusive",
            ("not_calibrated", *codes),
            evidence=_cost(cm) | evidence,
            facts=facts,
        )
    if "candidate" not in cm.scores or "original" not in cm.scores:
        return Finding("inconclusive", ("not_scored",))
    return None


def _cost(cm: ClientMembershipEvidence) -> dict[str, Any]:
    return {"cost_seconds": cm.cost_seconds, "cost_client_epochs": cm.cost_client_epochs}


def _null(cm: ClientMembershipEvidence) -> tuple[dict[str, Any], tuple[str, ...], dict]:
    """Which null the test used, the codes that say so, and the facts they quote."""
    references = str(cm.notes.get("references") or "per_request")
    evidence: dict[str, Any] = {"references": references}
    fallback = cm.notes.get("held_out_fallback")
    if fallback:  # asked for the held-out null, which did not apply
        evidence["held_out_fallback"] = str(fallback)
        return evidence, ("held_out_fallback",), {"fallback": str(fallback)}
    if references != "held_out":
        return evidence, (), {}
    given = bool(cm.notes.get("anchor_given"))
    evidence["anchor"] = "given by the caller" if given else "trained by the receipt"
    return evidence, (NO_LIMIT_CODE,), {"anchor_given": given}


def _graded(cm: ClientMembershipEvidence, applied: float) -> Graded:
    """The candidate at its line; the original copies at that line and their own; Retrain."""
    controls: dict[str, Verdict] = {
        label: "fail" if cm.scores[label] > max(applied, client_line(cm, label)) else "pass"
        for label in cm.scores
        if label.startswith("original")
    }
    candidate: Verdict = "fail" if cm.scores["candidate"] > applied else "pass"
    positive: Verdict | None = None
    if "retrain" in cm.scores and math.isfinite(cm.scores["retrain"]):
        positive = "fail" if cm.scores["retrain"] > client_line(cm, "retrain") else "pass"
    return with_controls(candidate, controls, positive)


def _verdict(cm: ClientMembershipEvidence, graded: Graded) -> tuple[Verdict, str]:
    """The verdict after the positive control and the fitness region, and its main code."""
    value, region = cm.scores["candidate"], cm.region("candidate")
    verdict = graded.verdict
    if verdict == "fail" and graded.positive_flagged:
        verdict = "warn"  # the test flags a clean Retrain too: not cleared, not shown to remain
    demoted = verdict == "fail" and region == "below" and not path_scores(cm)
    if demoted:
        verdict = "warn"  # above every "with" reference is not enough for an under-trained model
    off_range = verdict != "fail" and region in ("below", "above")
    if not math.isfinite(value) or region == "invalid":
        return "inconclusive", "invalid"
    if region == "elsewhere":  # not trained from the run's M_0: the references say nothing
        return "inconclusive", "off_ground"
    if off_range:
        verdict = "warn" if region == "below" and value > cm.threshold else "inconclusive"
    if graded.positive_flagged:
        return verdict, "flags_retrain"
    if demoted:
        return verdict, "less_trained_unmeasured"
    if verdict == "fail":
        return verdict, {"below": "found_below", "above": "found_above"}.get(region, "found")
    if off_range:
        return verdict, "off_range_warn" if verdict == "warn" else "off_range"
    return verdict, "no_power" if verdict == "inconclusive" else "pass"


def _line_kind(cm: ClientMembershipEvidence, line: float, region: str) -> str:
    if region == "below":
        return "below_path" if path_scores(cm) else "below"
    if line > cm.threshold:
        return "unknown_raised" if region == "unknown" else "raised"
    return "plain"


def _facts(ev: Evidence, cm: ClientMembershipEvidence, applied: float, g: Graded) -> dict:
    region = cm.region("candidate")
    low, high = cm.domain or (math.nan, math.nan)
    path = path_scores(cm) if region == "below" else {}
    first = g.unflagged[0] if g.unflagged else "original"
    return {
        "clients": ev.clients_text,
        "value": cm.scores["candidate"],
        "original": cm.scores["original"],
        "retrain": cm.scores.get("retrain"),
        "threshold": cm.threshold,
        "applied": applied,
        "line_kind": _line_kind(cm, applied, region),
        "side": "less" if region == "below" else "more",
        "fitness": cm.fitness.get("candidate", math.nan),
        "low": low,
        "high": high,
        "in_max": cm.in_max,
        "path": path_rounds(path) if path else "",
        "path_top": max(path.values()) if path else None,
        "any_path": bool(path_scores(cm)),
        "unflagged": first,
        "unflagged_score": cm.scores.get(first, math.nan),
        "power": cm.power,
        "ground": cm.ground.get("candidate"),
    }


def judge(ev: Evidence, th: VerificationThresholds) -> Finding:
    """Grade the score at the line of the model's fitness, under the controls."""
    cm = ev.client_membership
    assert cm is not None
    region = cm.region("candidate")
    applied = client_line(cm, "candidate")
    graded = _graded(cm, applied)
    verdict, code = _verdict(cm, graded)
    clean = {k: v for k, v in cm.scores.items() if k.startswith("retrain")}
    threshold = {
        "fail": applied,
        "line": cm.threshold if region == "below" else applied,
        "calibrated": cm.threshold,
        "target_fpr": cm.target_fpr,
    }
    power = {
        "original_flagged": graded.original_flagged,
        "controls": graded.controls,
        "retrain_flagged": graded.positive_flagged,
        "clean_controls_above_threshold": sorted(k for k, v in clean.items() if v > cm.threshold),
        "power": cm.power,
        "reference_models": cm.num_reference_models,
    }
    null, null_codes, null_facts = _null(cm)
    evidence: dict[str, Any] = _cost(cm) | null
    if cm.domain is not None:
        evidence |= {
            "fitness": dict(cm.fitness),
            "reference_fitness_range": list(cm.domain),
            "region": region,
            "in_max": cm.in_max,
        }
    if region == "below" and path_scores(cm):
        evidence["clean_path"] = path_scores(cm)
    se = (cm.notes.get("score_se") or {}).get("candidate")
    evidence["interval"] = mean_interval(cm.scores["candidate"], se, cm.notes.get("examples"))
    reference = {k: v for k, v in cm.scores.items() if k != "candidate"}
    facts = _facts(ev, cm, applied, graded) | {"warned": verdict == "warn"} | null_facts
    value = cm.scores["candidate"]
    codes = (code, *null_codes)
    # the held-out null states no detection limit: its pass cannot ground ``not_detected``
    # (``unlearn.receipt.influence_basis``, basis ``no_limit``); its flag still says remains
    decisive = NO_LIMIT_CODE not in null_codes
    return Finding(verdict, codes, value, reference, threshold, evidence, power, facts, decisive)


RULE = Rule("client_membership", "client-level membership", judge, applies)
