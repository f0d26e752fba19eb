"""Rule 3b, ``markers``: the forgotten clients' participation markers no longer work.

Measure: per marked forgotten client, the marker rate (marked probe inputs classified as the
client's secret target; ``MarkerEvidence``) of the model and of its controls.
Grade, per client: the excess over Retrain's rate (else over the same model's rate for
never-embedded decoy patterns) against ``marker_warn`` / ``marker_fail`` or 3 / 4 binomial
standard errors, whichever is larger; without Retrain a model is flagged only if it also keeps
the original's rate within the fail margin. The worst client decides. The original (and with
noise) must be flagged for every client and Retrain for none. Off the references' ground a
flag needs every clean, less trained model below it too (``fitness``), else it is a warning.
"""

from __future__ import annotations

import math
from typing import Any

from fedunlearn.eval.markers import MarkerEvidence
from fedunlearn.eval.receipt.controls import with_controls
from fedunlearn.eval.receipt.evidence import Evidence
from fedunlearn.eval.receipt.finding import Finding, Rule, grade, worst
from fedunlearn.eval.receipt.fitness import less_trained, path_rounds
from fedunlearn.eval.receipt.intervals import wilson
from fedunlearn.eval.receipt.thresholds import VerificationThresholds
from fedunlearn.unlearn.receipt import Verdict

__all__ = ["RULE"]


def _margins(base: float, probes: int, th: VerificationThresholds) -> tuple[float, float]:
    """The warn and fail margins: fixed, or 3 / 4 binomial SE of a difference of two rates."""
    n = max(probes, 1)
    p = min(max(base, 1.0 / n), 1.0 - 1.0 / n)
    se = math.sqrt(2 * p * (1 - p) / n)
    return max(th.marker_warn, 3 * se), max(th.marker_fail, 4 * se)


def _client(
    mk: MarkerEvidence, label: str, c: int, th: VerificationThresholds
) -> tuple[Verdict, dict[str, Any]]:
    """One client's grade of model ``label`` against Retrain's rate (else the decoys')."""
    rate = mk.rates[label][c]
    with_retrain = "retrain" in mk.rates
    base = mk.rates["retrain"][c] if with_retrain else mk.decoy_rates[label][c]
    warn, fail = _margins(base, mk.probes[c], th)
    verdict = grade(rate - base, warn, fail)
    entry: dict[str, Any] = {"rate": rate, "reference": base, "warn": base + warn}
    entry["fail"] = base + fail
    if not with_retrain and verdict == "fail":
        # a clean model's rate for this very pattern can sit well above the decoys' (28%
        # against 7% measured): without Retrain only a model near the original's rate is flagged
        keeps = mk.rates["original"][c] - fail
        entry["fail"] = max(base + fail, keeps)
        if rate < keeps:
            verdict = "warn"
    return verdict, entry


def _beyond_path(
    mk: MarkerEvidence,
    c: int,
    verdict: Verdict,
    entry: dict[str, Any],
    path: list[str],
    th: VerificationThresholds,
) -> None:
    """Mark a less-trained candidate's flag ``demoted`` unless beyond every clean path model."""
    entry["clean_path_top"] = None
    if not path:
        entry["demoted"] = verdict == "fail"
        return
    top = max(mk.rates[p][c] for p in path)
    entry["clean_path_top"] = top
    if top > entry["reference"]:
        _, margin = _margins(top, mk.probes[c], th)
        beyond = grade(entry["rate"] - top, *_margins(top, mk.probes[c], th))
        entry["fail"] = max(entry["fail"], top + margin)
        entry["demoted"] = verdict == "fail" and beyond != "fail"


def _model(
    mk: MarkerEvidence, label: str, th: VerificationThresholds, path: list[str] | None = None
) -> tuple[Verdict, dict[int, dict[str, Any]]]:
    """Every client's grade of model ``label``; ``path``: the clean path to clear (less trained)."""
    per: dict[int, dict[str, Any]] = {}
    verdicts: list[Verdict] = []
    for c in mk.clients:
        verdict, entry = _client(mk, label, c, th)
        if path is not None:
            _beyond_path(mk, c, verdict, entry, path, th)
        entry["flagged"] = verdict == "fail"
        per[c] = entry
        verdicts.append(verdict)
    return worst(verdicts), per


def applies(ev: Evidence) -> Finding | None:
    """n/a without a marked forgotten client; inconclusive without the original's rate."""
    mk = ev.markers
    if mk is None or not mk.clients:
        return Finding("n/a", ("no_marker",))
    if "original" not in mk.rates:
        return Finding("inconclusive", ("original_not_measured",))
    return None


def _codes(
    verdict: Verdict,
    why: str | None,
    less: bool,
    flag_top: float | None,
    demoted_top: dict[str, float] | None,
) -> tuple[str, ...]:
    codes = [why or {"fail": "survives", "pass": "pass", "warn": "partly"}[verdict]]
    if verdict == "fail" and less and flag_top is not None:
        codes.append("less_trained_beyond")
    if demoted_top is not None and verdict == "warn":
        codes.append("less_trained_demoted" if demoted_top else "less_trained_unmeasured")
    return tuple(codes)


def _facts(
    mk: MarkerEvidence, per: dict[int, dict[str, Any]], client: int, with_retrain: bool
) -> dict[str, Any]:
    return {
        "client": client,
        "rate": per[client]["rate"],
        "base": per[client]["reference"],
        "original": mk.rates["original"][client],
        "base_name": "Retrain" if with_retrain else "never-embedded decoy patterns",
        "shown": [(c, p["rate"], p["reference"], mk.rates["original"][c]) for c, p in per.items()],
        "path_top": per[client].get("clean_path_top"),
    }


def judge(ev: Evidence, th: VerificationThresholds) -> Finding:
    """Grade every marked client; the worst decides, under the controls and the clean path."""
    mk = ev.markers
    assert mk is not None
    less = less_trained(ev)
    path = [p for p in mk.rates if p.startswith("clean_round_")] if less else []
    candidate, per = _model(mk, "candidate", th, path if less else None)
    others = {label: _model(mk, label, th) for label in mk.rates if label != "candidate"}
    controls: dict[str, Verdict] = {
        label: "fail" if all(p["flagged"] for p in entries.values()) else "pass"
        for label, (_, entries) in others.items()
        if label.startswith("original")
    }
    with_retrain = "retrain" in mk.rates
    graded = with_controls(candidate, controls, others["retrain"][0] if with_retrain else None)
    verdict = graded.verdict
    flagged = [c for c, p in per.items() if p["flagged"]]
    demoted = [c for c in flagged if per[c].get("demoted")]
    if verdict == "fail" and flagged and len(demoted) == len(flagged):
        verdict = "warn"  # every flag is on a less trained model a clean one comes as close to
    excess = {c: p["rate"] - p["reference"] for c, p in per.items()}
    named = [c for c in flagged if c not in demoted] or flagged or list(excess)
    client = max(named, key=lambda c: excess[c])
    demoted_top = {p: max(mk.rates[p][c] for c in demoted) for p in path} if demoted else None
    codes = _codes(verdict, graded.why, less, per[client].get("clean_path_top"), demoted_top)
    reference: dict[str, Any] = {
        "original": {c: mk.rates["original"][c] for c in mk.clients},
        "retrain": {c: mk.rates["retrain"][c] for c in mk.clients} if with_retrain else None,
        "decoy": {c: mk.decoy_rates["candidate"][c] for c in mk.clients},
    }
    if path:
        reference["clean_path"] = {p: dict(mk.rates[p]) for p in path}
    original = others["original"][1]
    power = {
        "original_flagged": graded.original_flagged,
        "controls": graded.controls,
        "separation_points": {
            c: 100 * (original[c]["rate"] - original[c]["reference"]) for c in mk.clients
        },
        "less_trained": less,
    }
    facts = _facts(mk, per, client, with_retrain) | {
        "unflagged": graded.unflagged[0] if graded.unflagged else "",
        "path": path_rounds(path) if path else "",
        "demoted_path": path_rounds(demoted_top) if demoted_top else "",
        "demoted_top": max(demoted_top.values()) if demoted_top else None,
    }
    threshold = {
        "warn": {c: p["warn"] for c, p in per.items()},
        "fail": {c: p["fail"] for c, p in per.items()},
    }
    evidence = {
        "per_client": per,
        "probes": dict(mk.probes),
        "interval": wilson(per[client]["rate"], mk.probes.get(client)),
    }
    value = per[client]["rate"]
    return Finding(verdict, codes, value, reference, threshold, evidence, power, facts)


RULE = Rule("markers", "participation markers", judge, applies)
