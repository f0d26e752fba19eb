"""The receipt's checks: measured evidence in, one verdict per check out.

``build_verification(evidence, thresholds)`` turns what ``fedunlearn.eval.Verifier`` measured
about one model (its result row from ``Judge``, the rows of the original model and of Retrain
when one exists, the method's certified bound and warnings, the store's deletion evidence) into
a ``Verification``: seven checks, each with its value, the reference it is judged against, the
thresholds, a verdict (``pass``, ``warn``, ``fail``, ``n/a``) and one sentence. Everything here
is pure (rows in, values out), so each rule is tested on hand-made rows.

The checks, in order (docs/verification.md gives the rules, the thresholds and their
calibration):

1. ``backdoor``: backdoor ASR on triggered test inputs against Retrain's (or, without Retrain,
   an assumed clean-model ASR) and the original's;
2. ``membership``: loss-threshold and shadow-model attacks on the forgotten clients' clean
   training data against unseen data (AUC), against Retrain's AUC (or chance, 0.5);
3. ``distance``: ``||u - r|| / ||o - r||`` to the retrained model r, relative to the
   original o's distance; a model that stayed at the original fails;
4. ``bound``: the method's certified bound (``Details.certified_bound()``) against the distance
   it bounds;
5. ``utility``: test accuracy against Retrain's (or the original's);
6. ``deletion``: the forgotten clients' update payloads still held in the store, the deletion
   records, and whether reads of deleted payloads fail (``deletion_evidence``);
7. ``method_warnings``: the sentences a method put in ``details.warnings``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fedunlearn.errors import ConfigError
from fedunlearn.unlearn.receipt import BoundReport, Check, Verdict, Verification

__all__ = [
    "CHECK_NAMES",
    "Evidence",
    "VerificationThresholds",
    "auc_standard_error",
    "build_verification",
]

CHECK_NAMES = (
    "backdoor",
    "membership",
    "distance",
    "bound",
    "utility",
    "deletion",
    "method_warnings",
)
CHANCE_AUC = 0.5


class VerificationThresholds(BaseModel):
    """Thresholds of the receipt's checks (defaults calibrated in docs/verification.md).

    Every "excess" is the judged model's value minus the reference's: Retrain's when a Retrain
    reference exists, otherwise the stated fallback.

    Attributes:
        backdoor_warn: Excess backdoor ASR (absolute, in [0, 1]) above which the backdoor check
            warns.
        backdoor_fail: Excess backdoor ASR above which it fails (the backdoor visibly survives).
        backdoor_clean_asr: ASR assumed for a clean model when there is no Retrain reference
            (triggered non-target inputs a clean model calls the target anyway).
        mia_auc_warn: Excess membership AUC (each attack against the same attack on Retrain;
            the fallback reference is chance, 0.5) above which the membership check warns.
        mia_auc_fail: Excess membership AUC above which it fails.
        mia_warn_z: The excess must also exceed this many standard errors of the AUC on the
            attacked sample sizes (Hanley-McNeil) to warn: sampling noise is not a trace.
        mia_fail_z: Standard errors the excess must exceed to fail.
        distance_warn: Relative distance ``||u - r|| / ||o - r||`` above which the distance
            check warns (1.0 is the original's own distance; clean models of a non-convex run
            land within a few percent of it, hence 1.25).
        distance_unchanged: If the model moved less than this share of the original-to-Retrain
            gap away from the original, the distance check fails: it is still the original
            model (its relative distance is then at least ``1 - distance_unchanged``).
        bound_tolerance: Relative slack when comparing an observed distance with a certified
            bound (float rounding).
        utility_warn: Test accuracy drop (absolute) below the reference above which the
            utility check warns.
        utility_fail: Drop above which it fails.
        deletion_on_forget: Verdict when a deletion request (``kind == "forget"``) leaves the
            forgotten clients' updates in the store: ``warn`` or ``fail``.
        method_warning: Verdict of a method's own warnings: ``warn`` or ``fail``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    backdoor_warn: float = Field(0.05, ge=0, le=1)
    backdoor_fail: float = Field(0.10, ge=0, le=1)
    backdoor_clean_asr: float = Field(0.05, ge=0, le=1)
    mia_auc_warn: float = Field(0.05, ge=0, le=0.5)
    mia_auc_fail: float = Field(0.10, ge=0, le=0.5)
    mia_warn_z: float = Field(3.0, ge=0)
    mia_fail_z: float = Field(4.0, ge=0)
    distance_warn: float = Field(1.25, gt=0)
    distance_unchanged: float = Field(0.1, ge=0, le=1)
    bound_tolerance: float = Field(1e-6, ge=0)
    utility_warn: float = Field(0.02, ge=0, le=1)
    utility_fail: float = Field(0.05, ge=0, le=1)
    deletion_on_forget: Literal["warn", "fail"] = "warn"
    method_warning: Literal["warn", "fail"] = "warn"

    def model_post_init(self, _context: Any) -> None:
        """Check each warn threshold is at most its fail threshold."""
        for name in ("backdoor", "mia_auc", "utility", "mia"):
            suffix = "_z" if name == "mia" else ""
            warn = getattr(self, f"{name}_warn{suffix}")
            fail = getattr(self, f"{name}_fail{suffix}")
            if warn > fail:
                raise ConfigError(
                    f"verification thresholds: {name}_warn{suffix} ({warn}) must not exceed "
                    f"{name}_fail{suffix} ({fail}); lower the warn level or raise the fail level"
                )


@dataclass(frozen=True)
class Evidence:
    """What was measured about one model, for ``build_verification``.

    Attributes:
        row: The judged model's result row (``Judge``: ``test_accuracy``, ``backdoor_asr``,
            ``mia_auc``, ``mia_loss_auc``, ``distance_to_retrain``, ``distance_to_original``).
        original: The original (final, not unlearned) model's row.
        retrain: Retrain's row, or None if no Retrain reference was computed.
        retrain_gap: ``||o - r||``, the original's distance to Retrain (None without Retrain).
        request_kind: ``forget`` (deletion request) or ``recover`` (poisoning).
        backdoor: Whether the run has a backdoor attack.
        attackers_forgotten: How many of the run's attacking clients the request removes.
        attackers_total: How many attacking clients the run has.
        bound: The method's certified bound, if it provides one.
        warnings: The method's own warnings (``details.warnings``).
        deletion: The store's deletion evidence (``deletion_evidence``), or None if no store
            was available.
    """

    row: Mapping[str, Any]
    original: Mapping[str, Any]
    retrain: Mapping[str, Any] | None = None
    retrain_gap: float | None = None
    request_kind: str = "forget"
    backdoor: bool = False
    attackers_forgotten: int = 0
    attackers_total: int = 0
    bound: BoundReport | None = None
    warnings: tuple[str, ...] = ()
    deletion: Mapping[str, Any] | None = field(default=None)


def _num(value: Any) -> float | None:
    """Return ``value`` as a finite float, or None."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _grade(excess: float, warn: float, fail: float) -> Verdict:
    return "pass" if excess <= warn else "warn" if excess <= fail else "fail"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


# --- 1. backdoor ------------------------------------------------------------------------------


def check_backdoor(ev: Evidence, th: VerificationThresholds) -> Check:
    """Check 1: the backdoor no longer works (ASR near Retrain's, or a clean model's)."""
    title = "backdoor removed"
    if not ev.backdoor:
        return Check("backdoor", title, "n/a", reason="the run has no backdoor attack")
    if ev.attackers_forgotten == 0:
        return Check(
            "backdoor", title, "n/a", reason="none of the forgotten clients planted the backdoor"
        )
    asr = _num(ev.row.get("backdoor_asr"))
    original = _num(ev.original.get("backdoor_asr"))
    retrain = _num(ev.retrain.get("backdoor_asr")) if ev.retrain is not None else None
    if asr is None or original is None:
        return Check("backdoor", title, "n/a", reason="the backdoor ASR could not be measured")
    if retrain is not None:
        base, base_name = retrain, "Retrain"
    elif ev.attackers_forgotten < ev.attackers_total:
        return Check(
            "backdoor",
            title,
            "n/a",
            reference={"original": original},
            reason=(
                f"{ev.attackers_total - ev.attackers_forgotten} other backdoor client(s) stay in "
                "the federation, so only a Retrain reference says what ASR to expect "
                "(--reference retrain)"
            ),
        )
    else:
        base, base_name = th.backdoor_clean_asr, "a clean model (assumed)"
    short = "Retrain" if retrain is not None else "a clean model, assumed"
    reference = {"original": original, "retrain": retrain}
    if retrain is None:
        reference["clean_assumed"] = th.backdoor_clean_asr
    threshold = {"warn": base + th.backdoor_warn, "fail": base + th.backdoor_fail}
    evidence = {
        "asr_forgotten_data": _num(ev.row.get("backdoor_asr_forgotten")),
        "original_asr_forgotten_data": _num(ev.original.get("backdoor_asr_forgotten")),
    }
    if original - base <= th.backdoor_warn:
        return Check(
            "backdoor",
            title,
            "n/a",
            asr,
            reference,
            threshold,
            f"the original model shows no backdoor to remove (ASR {_pct(original)} vs "
            f"{_pct(base)} for {base_name})",
            evidence=evidence,
        )
    evidence["share_removed"] = (original - asr) / (original - base)
    verdict = _grade(asr - base, th.backdoor_warn, th.backdoor_fail)
    if verdict == "pass":
        reason = f"ASR {_pct(asr)} ({short}: {_pct(base)}; {_pct(original)} before unlearning)"
    else:
        reason = (
            f"the backdoor {'survives' if verdict == 'fail' else 'partly survives'}: ASR "
            f"{_pct(asr)} on triggered test inputs against {_pct(base)} for {base_name} "
            f"({_pct(original)} before unlearning)"
        )
    return Check("backdoor", title, verdict, asr, reference, threshold, reason, evidence=evidence)


# --- 2. membership ----------------------------------------------------------------------------


_ATTACKS = (("shadow", "mia_auc", "mia_samples"), ("loss", "mia_loss_auc", "mia_loss_samples"))


def auc_standard_error(num_members: int, num_nonmembers: int) -> float:
    """Return the standard error of an AUC of 0.5 on this many members and non-members.

    Hanley and McNeil (Radiology 1982), Eq. 2 at A = 0.5 (Q1 = Q2 = 1/3): the spread of an
    attack's AUC on a model that cannot tell the two sets apart, i.e. the sampling noise.
    """
    if num_members < 1 or num_nonmembers < 1:
        return math.inf
    # Eq. 2: SE^2 = (A(1-A) + (n1-1)(Q1-A^2) + (n2-1)(Q2-A^2)) / (n1 n2), A = 1/2
    variance = (0.25 + (num_members - 1) / 12 + (num_nonmembers - 1) / 12) / (
        num_members * num_nonmembers
    )
    return math.sqrt(variance)


def _attack_auc(row: Mapping[str, Any] | None, key: str) -> float | None:
    return None if row is None else _num(row.get(key))


def check_membership(ev: Evidence, th: VerificationThresholds) -> Check:
    """Check 2: membership attacks no longer recognise the forgotten clients' clean data.

    Each attack's AUC is judged against the same attack on Retrain (or chance, 0.5); a margin
    counts only where it is both larger than the threshold and than ``mia_warn_z`` (for a fail
    ``mia_fail_z``) standard errors of the AUC on these sample sizes, so that a few hundred
    samples' noise does not fail a clean model. The worse attack decides.
    """
    title = "membership"
    graded = []
    evidence: dict[str, Any] = {}
    for name, key, samples_key in _ATTACKS:
        value = _attack_auc(ev.row, key)
        if value is None:
            continue
        retrain = _attack_auc(ev.retrain, key)
        base = retrain if retrain is not None else CHANCE_AUC
        samples = ev.row.get(samples_key)  # rows without sample sizes get no noise allowance
        se = auc_standard_error(int(samples[0]), int(samples[1])) if samples else 0.0
        warn = max(th.mia_auc_warn, th.mia_warn_z * se)
        fail = max(th.mia_auc_fail, th.mia_fail_z * se)
        verdict = _grade(value - base, warn, fail)
        evidence[f"{name}_auc"] = value
        evidence[f"{name}_reference"] = base
        evidence[f"{name}_original"] = _attack_auc(ev.original, key)
        evidence[f"{name}_standard_error"] = se
        graded.append((_SEVERITY_ORDER[verdict], value - base, name, value, base, warn, fail))
    if not graded:
        return Check("membership", title, "n/a", reason="no membership attack could be run")
    _, _, name, value, base, warn, fail = max(graded)
    verdict = {0: "pass", 1: "warn", 2: "fail"}[max(graded)[0]]
    base_name = "Retrain" if ev.retrain is not None else "chance"
    original = _attack_auc(ev.original, "mia_auc" if name == "shadow" else "mia_loss_auc")
    reference = {"original": original, "retrain": base if ev.retrain is not None else None}
    reference["chance"] = CHANCE_AUC
    threshold = {"warn": base + warn, "fail": base + fail}
    evidence["shadow_member_rate"] = _num(ev.row.get("mia_member_rate"))
    evidence["decided_by"] = name
    if verdict == "pass":
        reason = f"{name} attack AUC {value:.3f}, {base_name} {base:.3f}"
        if original is not None and original - base <= warn:
            reason += f"; the attacks barely recognise them on the original either ({original:.3f})"
    else:
        reason = (
            f"the {name} attack still tells the forgotten clients' data from unseen data: AUC "
            f"{value:.3f} against {base:.3f} for {base_name}"
            + (f" ({original:.3f} before unlearning)" if original is not None else "")
        )
    return Check(
        "membership", title, verdict, value, reference, threshold, reason, evidence=evidence
    )


_SEVERITY_ORDER = {"pass": 0, "warn": 1, "fail": 2}


# --- 3. distance ------------------------------------------------------------------------------


def check_distance(ev: Evidence, th: VerificationThresholds) -> Check:
    """Check 3: the model moved from the original towards the retrained model."""
    title = "distance to Retrain"
    moved = _num(ev.row.get("distance_to_original"))
    if ev.retrain is None or ev.retrain_gap is None:
        if moved == 0.0:
            return Check(
                "distance",
                title,
                "fail",
                0.0,
                reason="the model is the original model, unchanged",
                evidence={"distance_to_original": 0.0},
            )
        return Check(
            "distance",
            title,
            "n/a",
            reason="no Retrain reference was computed (--reference retrain computes one)",
            evidence={"distance_to_original": moved},
        )
    left = _num(ev.row.get("distance_to_retrain"))
    gap = ev.retrain_gap
    if left is None or moved is None:
        return Check("distance", title, "n/a", reason="the distances could not be measured")
    evidence = {"distance_to_retrain": left, "distance_to_original": moved, "original_gap": gap}
    threshold = {"warn": th.distance_warn, "unchanged": th.distance_unchanged}
    if gap == 0.0:
        verdict: Verdict = "pass" if left == 0.0 else "warn"
        return Check(
            "distance",
            title,
            verdict,
            None,
            {"original": 0.0},
            threshold,
            "the original model equals Retrain: the forgotten clients had no influence"
            + ("" if left == 0.0 else f"; this model is {left:.4g} away from both"),
            evidence=evidence,
        )
    relative = left / gap
    moved_share = moved / gap
    evidence["moved_share_of_gap"] = moved_share
    reference = {"original": 1.0, "retrain": 0.0}
    if moved_share < th.distance_unchanged:
        verdict = "fail"
        reason = (
            f"the model is still the original model: it moved {moved_share:.0%} of the "
            f"original-to-Retrain gap ({relative:.2f} of the original's distance to Retrain)"
        )
    elif relative <= th.distance_warn:
        verdict, reason = "pass", f"{relative:.2f} of the original's distance to Retrain"
    else:
        verdict = "warn"
        reason = (
            f"{relative:.2f}x the original's distance from Retrain (warns above "
            f"{th.distance_warn:g}x): farther than the original (a model on another training "
            "path can still be clean; the other checks decide)"
        )
    return Check(
        "distance", title, verdict, relative, reference, threshold, reason, evidence=evidence
    )


# --- 4. certified bound -----------------------------------------------------------------------


def check_bound(ev: Evidence, th: VerificationThresholds) -> Check:
    """Check 4: the observed distance respects the method's certified bound."""
    title = "certified bound"
    bound = ev.bound
    if bound is None:
        return Check("bound", title, "n/a", reason="the method certifies no bound")
    observed = bound.observed
    source = "measured by the method"
    if observed is None and bound.reference == "retrain":
        observed = _num(ev.row.get("distance_to_retrain")) if ev.retrain is not None else None
        source = "distance to Retrain"
    reference = {"bound": bound.bound, "name": bound.name, "to": bound.reference}
    evidence = {"observed_source": source, "note": bound.note}
    if observed is None:
        return Check(
            "bound",
            title,
            "n/a",
            reference=reference,
            reason=f"{bound.name}: the distance it bounds was not measured",
            evidence=evidence,
        )
    limit = bound.bound * (1 + th.bound_tolerance)
    threshold = {"max": limit}
    if observed <= limit:
        reason = f"{bound.name}: observed {observed:.4g} <= bound {bound.bound:.4g}"
        return Check(
            "bound", title, "pass", observed, reference, threshold, reason, "model", evidence
        )
    reason = (
        f"{bound.name} does not hold: the observed distance {observed:.4g} to "
        f"{bound.reference} exceeds the certified {bound.bound:.4g}"
    )
    return Check("bound", title, "fail", observed, reference, threshold, reason, "model", evidence)


# --- 5. utility -------------------------------------------------------------------------------


def check_utility(ev: Evidence, th: VerificationThresholds) -> Check:
    """Check 5: test accuracy stays near Retrain's (or the original's)."""
    title = "utility"
    acc = _num(ev.row.get("test_accuracy"))
    original = _num(ev.original.get("test_accuracy"))
    retrain = _num(ev.retrain.get("test_accuracy")) if ev.retrain is not None else None
    base, base_name = (retrain, "Retrain") if retrain is not None else (original, "the original")
    if acc is None or base is None:
        return Check("utility", title, "n/a", reason="test accuracy could not be measured")
    reference = {"original": original, "retrain": retrain}
    threshold = {"warn": base - th.utility_warn, "fail": base - th.utility_fail}
    drop = base - acc
    verdict = _grade(drop, th.utility_warn, th.utility_fail)
    if verdict == "pass":
        reason = f"test accuracy {_pct(acc)}, {base_name} {_pct(base)}"
    else:
        reason = (
            f"test accuracy {_pct(acc)} is {100 * drop:.1f} points below {base_name} ({_pct(base)})"
        )
    return Check("utility", title, verdict, acc, reference, threshold, reason)


# --- 6. deletion ------------------------------------------------------------------------------


def _when(seconds: Any) -> str:
    try:
        return datetime.fromtimestamp(float(seconds), UTC).strftime("%Y-%m-%d %H:%M UTC")
    except (TypeError, ValueError, OverflowError):
        return "an unknown time"


def check_deletion(ev: Evidence, th: VerificationThresholds) -> Check:
    """Check 6: the forgotten clients' stored updates are deleted and cannot be read back."""
    title = "stored data deleted"
    d = ev.deletion
    if d is None:
        return Check(
            "deletion", title, "n/a", scope="store", reason="the run's history store was not read"
        )
    held = {str(k): int(v) for k, v in (d.get("bytes_held") or {}).items()}
    held_total = sum(held.values())
    read_back = d.get("read_back") or {}
    readable = list(read_back.get("readable") or [])
    records = list(d.get("records") or [])
    deleted_bytes = sum(int(r.get("size_bytes", 0)) for r in records)
    evidence = {
        "bytes_held": held,
        "payloads_held": d.get("payloads_held"),
        "records": records,
        "read_back": read_back,
    }
    for key in ("scan",):  # optional, richer evidence a store may add (see deletion_evidence)
        if key in d:
            evidence[key] = d[key]
    reference = {"bytes_held": 0}
    if readable:
        shown = ", ".join(f"round {r} client {c}" for r, c in readable[:3])
        return Check(
            "deletion",
            title,
            "fail",
            float(held_total),
            reference,
            reason=f"{len(readable)} deleted payload(s) can still be read ({shown})",
            scope="store",
            evidence=evidence,
        )
    scan = d.get("scan")
    if isinstance(scan, Mapping) and scan.get("ok") is False:
        return Check(
            "deletion",
            title,
            "fail",
            float(held_total),
            reference,
            reason="deleted data is still in the store's files: "
            + str(scan.get("reason", "the page scan found it")),
            scope="store",
            evidence=evidence,
        )
    if held_total > 0:
        ids = [c for c in sorted(held, key=int) if held[c] > 0]
        clients = ", ".join(ids)
        if ev.request_kind == "recover":
            return Check(
                "deletion",
                title,
                "n/a",
                float(held_total),
                reference,
                reason=(
                    f"a recovery request does not ask to delete the attackers' updates "
                    f"({held_total:,} bytes of clients {clients} are kept)"
                ),
                scope="store",
                evidence=evidence,
            )
        return Check(
            "deletion",
            title,
            th.deletion_on_forget,
            float(held_total),
            reference,
            reason=(
                f"{held_total:,} bytes of updates of client(s) {clients} are still in the store; "
                f"delete them with 'fedunlearn forget RUN --clients {','.join(ids)}'"
            ),
            scope="store",
            evidence=evidence,
        )
    refused = int(read_back.get("refused", 0))
    if records:
        when = _when(max(float(r.get("forgotten_at", 0)) for r in records))
        reason = (
            f"{sum(int(r.get('num_payloads', 0)) for r in records)} payload(s), "
            f"{deleted_bytes:,} bytes, deleted at {when}; {refused} read(s) of them refused"
        )
    else:
        reason = "the store never held updates of the forgotten clients"
    return Check(
        "deletion", title, "pass", 0.0, reference, reason=reason, scope="store", evidence=evidence
    )


# --- 7. the method's own warnings --------------------------------------------------------------


def check_method_warnings(ev: Evidence, th: VerificationThresholds) -> Check:
    """Check 7: the method raised no warning about its own result."""
    title = "method warnings"
    if not ev.warnings:
        return Check("method_warnings", title, "pass", 0.0, reason="none")
    return Check(
        "method_warnings",
        title,
        th.method_warning,
        float(len(ev.warnings)),
        reason="; ".join(s.rstrip(".") for s in ev.warnings),
        evidence={"warnings": list(ev.warnings)},
    )


_CHECKS = (
    check_backdoor,
    check_membership,
    check_distance,
    check_bound,
    check_utility,
    check_deletion,
    check_method_warnings,
)


def build_verification(
    evidence: Evidence,
    thresholds: VerificationThresholds | None = None,
    *,
    subject: str = "",
) -> Verification:
    """Return the receipt of one model: every check, in ``CHECK_NAMES`` order.

    Args:
        evidence: What was measured about the model and its references.
        thresholds: The thresholds (defaults if None).
        subject: What is judged (a method name, a model file).
    """
    th = thresholds or VerificationThresholds()
    checks = tuple(check(evidence, th) for check in _CHECKS)
    references = ("original", "retrain") if evidence.retrain is not None else ("original",)
    return Verification(checks, references, th.model_dump(mode="json"), subject)
