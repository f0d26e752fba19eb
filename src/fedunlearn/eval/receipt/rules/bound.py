"""Rule 6, ``bound`` (method): the returned model respects the method's certified bound.

Measure: the returned model's distance to Retrain (``row["distance_to_retrain"]``).
Grade: within the bound (``bound_tolerance`` of slack) ``pass``, else ``fail``. n/a when the
method certifies nothing, when the bound is about another model (Crab: a retrain from the
rollback point before final tuning), without Retrain, or when it is vacuous: not below
``||M_0 - r||`` (a bound that large says nothing).
"""

from __future__ import annotations

from fedunlearn.eval.receipt.evidence import Evidence, num
from fedunlearn.eval.receipt.finding import Finding, Rule
from fedunlearn.eval.receipt.thresholds import VerificationThresholds
from fedunlearn.unlearn.receipt import Verdict

__all__ = ["RULE"]


def applies(ev: Evidence) -> Finding | None:
    """n/a unless a non-vacuous bound on the returned model's distance to Retrain is checkable."""
    bound = ev.claims.bound
    if bound is None:
        return Finding("n/a", ("no_bound",))
    reference: dict[str, object] = {"bound": bound.bound, "name": bound.name, "to": bound.reference}
    evidence = {"method_observed": bound.observed, "note": bound.note}
    facts = {"name": bound.name, "bound": bound.bound, "to": bound.reference}
    if bound.reference != "retrain":
        code = "other_model"
    elif ev.controls.retrain is None or ev.controls.initial_gap is None:
        code = "no_retrain"
    elif bound.bound >= ev.controls.initial_gap:
        reference["initial_to_retrain"] = ev.controls.initial_gap
        facts["initial_gap"] = ev.controls.initial_gap
        code = "vacuous"
    elif num(ev.row.get("distance_to_retrain")) is None:
        reference["initial_to_retrain"] = ev.controls.initial_gap
        code = "not_measured"
    else:
        return None
    return Finding("n/a", (code,), reference=reference, evidence=evidence, facts=facts)


def judge(ev: Evidence, th: VerificationThresholds) -> Finding:
    """Compare the distance to Retrain with the bound."""
    bound = ev.claims.bound
    assert bound is not None
    observed = float(ev.row["distance_to_retrain"])
    limit = bound.bound * (1 + th.bound_tolerance)
    reference = {
        "bound": bound.bound,
        "name": bound.name,
        "to": bound.reference,
        "initial_to_retrain": ev.controls.initial_gap,
    }
    evidence = {"method_observed": bound.observed, "note": bound.note}
    verdict: Verdict = "pass" if observed <= limit else "fail"
    facts = {"name": bound.name, "bound": bound.bound, "observed": observed}
    code = "holds" if verdict == "pass" else "broken"
    return Finding(verdict, (code,), observed, reference, {"max": limit}, evidence, facts=facts)


RULE = Rule("bound", "certified bound", judge, applies, aspect="method")
