"""Rule 5, ``distance`` (not decisive): the model left the original, lies where retrains do.

Measure: ``relative = ||u - r|| / ||o - r||`` and ``toward = <u - r, o - r> / ||o - r||^2``, the
model's position on the line from Retrain (0) to the original (1), and the same for the
negative controls; ``across = sqrt(relative^2 - toward^2)`` is the rest of the distance, orthogonal
to that line (why a model keeping 0.16 of the offset can lie 1.36x as far from Retrain as the
original: docs/verification.md, "Distance figures").
Grade, in order: moved less than ``distance_unchanged`` of the gap: ``fail`` (still the
original); ``toward`` at or beyond its line (the 95% prediction bound of at least 3 exact
retrains' positions, capped at ``distance_toward``; NaN included): ``warn``; within the pass
line (the band of independent retrains, else ``distance_pass``): ``pass`` if every negative
control lies outside it, else ``inconclusive``; beyond it: ``inconclusive``. Without Retrain:
``n/a``, except that a model identical to the original fails. Its pass never shows removal.
"""

from __future__ import annotations

import math
from typing import Any

from fedunlearn.eval.distance_band import upper_bound
from fedunlearn.eval.receipt.evidence import Evidence, Row, num
from fedunlearn.eval.receipt.finding import Finding, Rule
from fedunlearn.eval.receipt.thresholds import VerificationThresholds
from fedunlearn.unlearn.receipt import Verdict

__all__ = ["MIN_TOWARD_RETRAINS", "RULE", "across", "toward_line"]

MIN_TOWARD_RETRAINS = 3  # with 2, the 95% Student-t factor is 6.3 x the spread


def toward_line(ev: Evidence, th: VerificationThresholds) -> tuple[float, dict[str, Any]]:
    """The line of ``toward`` and where it comes from (facts for the wording)."""
    band, cm = ev.distance_band, ev.client_membership
    sources = (
        (band.toward if band is not None else (), "band"),
        (cm.reference_toward if cm is not None else (), "client_test"),
    )
    for measured, source in sources:
        finite = [float(v) for v in measured if math.isfinite(v)]
        if len(finite) >= MIN_TOWARD_RETRAINS:
            bound = upper_bound(finite)
            line = min(bound, th.distance_toward)
            facts = {"source": source, "count": len(finite), "low": min(finite)}
            return line, facts | {"high": max(finite), "bound": bound, "cap": th.distance_toward}
    return th.distance_toward, {"source": "fixed", "cap": th.distance_toward}


def across(relative: float, toward: float) -> float:
    """The model's offset from Retrain across the original's direction, in units of the gap.

    ``relative`` (``||u - r|| / ||o - r||``) splits into ``toward`` along ``o - r`` and this
    part orthogonal to it: ``relative^2 = toward^2 + across^2``. A model can keep little of the
    original's offset (``toward`` small) and still lie farther from Retrain than the original
    (``relative`` > 1): its distance is then across the line, not along it.
    """
    return math.sqrt(max(relative * relative - toward * toward, 0.0))


def _toward(left: float, moved: float, gap: float) -> float:
    """``<u - r, o - r> / ||o - r||^2`` from ``||u - r||``, ``||u - o||`` and ``||o - r||``."""
    return (left * left + gap * gap - moved * moved) / (2.0 * gap * gap)


def _position(row: Row, gap: float) -> tuple[float, float, float] | None:
    """(relative, moved share, toward) of a row, or None when its distances are unknown."""
    left, moved = num(row.get("distance_to_retrain")), num(row.get("distance_to_original"))
    if left is None or moved is None:
        return None
    toward = num(row.get("toward_original"))
    return left / gap, moved / gap, toward if toward is not None else _toward(left, moved, gap)


def applies(ev: Evidence) -> Finding | None:
    """n/a without Retrain (a model equal to the original fails); inconclusive at zero gap."""
    moved = num(ev.row.get("distance_to_original"))
    c = ev.controls
    if c.retrain is None or c.retrain_gap is None:
        if moved == 0.0:
            return Finding("fail", ("unchanged",), 0.0, evidence={"distance_to_original": 0.0})
        return Finding("n/a", ("no_retrain",), evidence={"distance_to_original": moved})
    left = num(ev.row.get("distance_to_retrain"))
    if left is None or moved is None:
        return Finding("n/a", ("not_measured",))
    if c.retrain_gap == 0.0:
        evidence = {"distance_to_retrain": left, "distance_to_original": moved, "original_gap": 0.0}
        verdict: Verdict = "pass" if left == 0.0 else "inconclusive"
        codes = ("no_gap",) if left == 0.0 else ("no_gap", "no_gap_away")
        facts = {"left": left}
        return Finding(verdict, codes, None, {"original": 0.0}, {}, evidence, facts=facts)
    return None


def judge(ev: Evidence, th: VerificationThresholds) -> Finding:
    """Place the model between Retrain and the original; grade it by the lines above."""
    gap = float(ev.controls.retrain_gap or 0.0)
    relative, moved_share, toward = _position(ev.row, gap) or (math.nan, math.nan, math.nan)
    line_toward, toward_facts = toward_line(ev, th)
    band = ev.distance_band
    line = band.band if band is not None else th.distance_pass
    power: dict[str, Any] = {}
    for label, row in ev.controls.negatives().items():
        placed = _position(row, gap)
        if placed is not None:
            power[label] = {
                "relative": placed[0],
                "flagged": placed[1] < th.distance_unchanged,
                "toward_original": placed[2],
            }
            if band is not None:
                power[label]["outside_band"] = placed[0] > line
    inside = [label for label, p in power.items() if not p.get("outside_band", True)]
    verdict: Verdict
    if moved_share < th.distance_unchanged:
        verdict, code = "fail", "still_original"
    elif not toward < line_toward:  # NaN included: it cannot be placed, so it is not cleared
        verdict, code = "warn", "toward"
    elif relative <= line:
        verdict, code = ("inconclusive", "no_power") if inside else ("pass", "pass")
    else:
        verdict, code = "inconclusive", "beyond"
    evidence: dict[str, Any] = {
        "distance_to_retrain": num(ev.row.get("distance_to_retrain")),
        "distance_to_original": num(ev.row.get("distance_to_original")),
        "original_gap": gap,
        "moved_share_of_gap": moved_share,
        "toward_original": toward,
        "toward_line": toward_facts,
    }
    threshold = {"pass": line, "unchanged": th.distance_unchanged, "toward": line_toward}
    if band is not None:
        evidence["band"] = band.to_dict()
    facts = {
        "relative": relative,
        "moved_share": moved_share,
        "toward": toward,
        "across": across(relative, toward),
        "line_toward": line_toward,
        "toward_source": toward_facts,
        "line": line,
        "band_count": None if band is None else len(band.relative),
        "band_low": None if band is None else min(band.relative),
        "band_high": None if band is None else max(band.relative),
        "band_level": None if band is None else band.level,
        "unflagged": inside[0] if inside else "",
        "unflagged_relative": power[inside[0]]["relative"] if inside else None,
    }
    reference = {"original": 1.0, "retrain": 0.0}
    return Finding(verdict, (code,), relative, reference, threshold, evidence, power, facts)


RULE = Rule("distance", "distance to Retrain", judge, applies, decisive=False)
