"""Rule 2, ``membership``: attacks no longer tell the forgotten clients' clean data from unseen.

Measure: the AUC of the shadow-model and the loss-threshold attack on the forgotten clients'
clean training data against unseen test data, with the sample sizes (``mia_samples``).
Grade, per attack: the excess over the same attack on Retrain (else chance, 0.5) must exceed
both the fixed threshold and ``mia_warn_z`` (to fail ``mia_fail_z``) Hanley-McNeil standard
errors. A flag counts whatever the controls; a pass counts only from an attack that flags every
negative control; otherwise ``inconclusive``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedunlearn.eval.receipt.evidence import Evidence, Row, num
from fedunlearn.eval.receipt.finding import SEVERITY, Finding, Rule, grade
from fedunlearn.eval.receipt.intervals import auc_interval
from fedunlearn.eval.receipt.thresholds import VerificationThresholds
from fedunlearn.unlearn.receipt import Verdict

__all__ = ["CHANCE_AUC", "RULE", "auc_standard_error"]

CHANCE_AUC = 0.5
_ATTACKS = (("shadow", "mia_auc", "mia_samples"), ("loss", "mia_loss_auc", "mia_loss_samples"))
_SUFFIX = {"shadow": "", "loss": "_loss"}


def auc_standard_error(num_members: int, num_nonmembers: int) -> float:
    """Return the standard error of an AUC of 0.5 on this many members and non-members.

    Hanley and McNeil (Radiology 1982), Eq. 2 at A = 0.5 (Q1 = Q2 = 1/3): the spread of an
    attack's AUC on a model that cannot tell the two sets apart, i.e. the sampling noise.
    """
    if num_members < 1 or num_nonmembers < 1:
        return math.inf
    variance = (0.25 + (num_members - 1) / 12 + (num_nonmembers - 1) / 12) / (
        num_members * num_nonmembers
    )
    return math.sqrt(variance)


@dataclass(frozen=True)
class _Attack:
    name: str
    key: str
    value: float
    base: float
    se: float
    warn: float
    fail: float
    candidate: Verdict
    controls: dict[str, Verdict]
    original: float | None

    def grade(self, row: Row | None) -> Verdict:
        auc = None if row is None else num(row.get(self.key))
        return "pass" if auc is None else grade(auc - self.base, self.warn, self.fail)

    @property
    def powered(self) -> bool:
        return all(v == "fail" for v in self.controls.values())

    @property
    def order(self) -> tuple[int, float]:
        return SEVERITY[self.candidate], self.value - self.base


def _attack(ev: Evidence, th: VerificationThresholds, name: str, key: str, n_key: str) -> _Attack:
    retrain = None if ev.controls.retrain is None else num(ev.controls.retrain.get(key))
    base = retrain if retrain is not None else CHANCE_AUC
    samples = ev.row.get(n_key)  # rows without sample sizes get no noise allowance
    se = auc_standard_error(int(samples[0]), int(samples[1])) if samples else 0.0
    warn, fail = max(th.mia_auc_warn, th.mia_warn_z * se), max(th.mia_auc_fail, th.mia_fail_z * se)
    value = float(ev.row[key])
    probe = _Attack(name, key, value, base, se, warn, fail, "pass", {}, None)
    controls = {label: probe.grade(row) for label, row in ev.controls.negatives().items()}
    original = num(ev.controls.original.get(key))
    return _Attack(name, key, value, base, se, warn, fail, probe.grade(ev.row), controls, original)


def applies(ev: Evidence) -> Finding | None:
    """n/a when no attack could be run (no AUC in the row)."""
    if any(num(ev.row.get(key)) is not None for _, key, _ in _ATTACKS):
        return None
    return Finding("n/a", ("no_attack",))


def judge(ev: Evidence, th: VerificationThresholds) -> Finding:
    """The worse attack decides a flag; a pass needs an attack with power."""
    attacks = [
        _attack(ev, th, name, key, n_key)
        for name, key, n_key in _ATTACKS
        if num(ev.row.get(key)) is not None
    ]
    worst = max(attacks, key=lambda a: a.order)
    powered = [a for a in attacks if a.powered]
    verdict: Verdict
    if worst.candidate == "fail":  # a flag counts whatever the controls
        chosen, verdict = worst, "fail"
    elif powered:
        chosen = max(powered, key=lambda a: a.order)
        verdict = chosen.candidate
    else:
        chosen, verdict = worst, "inconclusive"
    evidence: dict[str, object] = {}
    power: dict[str, object] = {}
    for a in attacks:
        evidence |= {
            f"{a.name}_auc": a.value,
            f"{a.name}_reference": a.base,
            f"{a.name}_original": a.original,
            f"{a.name}_standard_error": a.se,
        }
        separation = (a.original - a.base) / a.se if a.original is not None and a.se > 0 else None
        power[a.name] = {
            "original_flagged": a.controls.get("original") == "fail",
            "controls": a.controls,
            "separation_se": separation,
            "fail_line": a.base + a.fail,
        }
    evidence["shadow_member_rate"] = num(ev.row.get("mia_member_rate"))
    evidence["decided_by"] = chosen.name
    samples = ev.row.get(f"mia{_SUFFIX[chosen.name]}_samples")
    evidence["interval"] = auc_interval(chosen.value, samples)
    has_retrain = ev.controls.retrain is not None
    reference = {
        "original": chosen.original,
        "retrain": chosen.base if has_retrain else None,
        "chance": CHANCE_AUC,
    }
    unflagged = [k for k, v in chosen.controls.items() if v != "fail"] or ["original"]
    code = {"fail": "survives", "warn": "partly", "pass": "pass"}.get(verdict, "no_power")
    if code == "no_power" and chosen.original is None:
        code = "no_power_unmeasured"
    facts = {
        "attack": chosen.name,
        "auc": chosen.value,
        "base": chosen.base,
        "base_name": "Retrain" if has_retrain else "chance",
        "original": chosen.original,
        "separation": power[chosen.name]["separation_se"],  # type: ignore[index]
        "fail_line": chosen.base + chosen.fail,
        "unflagged": unflagged[0],
    }
    threshold = {"warn": chosen.base + chosen.warn, "fail": chosen.base + chosen.fail}
    return Finding(verdict, (code,), chosen.value, reference, threshold, evidence, power, facts)


RULE = Rule("membership", "membership", judge, applies)
