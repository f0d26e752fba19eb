"""The receipt's checks: measured evidence in, one verdict per check out.

``build_verification(evidence, thresholds)`` turns what ``fedunlearn.eval.Verifier`` measured
about one model (its result row from ``Judge``, the rows of its controls: the original model,
the original plus small noise, Retrain when one exists; the clean ASR measured on the initial
model; the client-level membership evidence; the method's bound, warnings and lineage; the
store's deletion evidence) into a ``Verification``: one ``Check`` per rule, each with its value,
reference, thresholds, measured power and a verdict (``pass``, ``warn``, ``fail``,
``inconclusive``, ``n/a``), plus the separate influence, utility and store verdicts. Everything
here is pure (rows in, values out), so each rule is tested on hand-made rows.

No pass without power: every statistical check grades its negative controls (the original
model, which carries the forgotten clients' influence, and the original plus small noise) with
the same rule as the candidate. If a negative control is not flagged, the candidate's verdict is
``inconclusive`` (never ``pass``); if the positive control (Retrain) is flagged, too.

The checks, in order (docs/verification.md gives the rules, the thresholds and their
calibration):

1. ``backdoor``: backdoor ASR on triggered test inputs against Retrain's (or the clean ASR
   measured on the initial model M_0); ``inconclusive`` when other attackers remain and there is
   no Retrain;
2. ``membership``: loss-threshold and shadow-model attacks on the forgotten clients' clean
   training data against unseen data (AUC), against Retrain's AUC (or chance, 0.5);
3. ``client_membership``: the client-level membership test (``ClientMembershipEvidence``),
   judged at the model's fitness: against clean controls no more trained than it, and
   ``inconclusive`` (or ``warn``) for a model trained less than every reference model;
3b. ``markers``: the forgotten clients' participation markers (``MarkerEvidence``): the share
   of marked probe inputs sent to each client's secret target, against Retrain's;
4. ``poisoning``: a non-backdoor poisoning's damage (test accuracy against Retrain's);
5. ``distance``: ``||u - r|| / ||o - r||``; a model that stayed at the original fails, a pass
   needs the band of independent exact retrains (``distance_band``, else the fixed
   ``distance_pass``) with the original outside it; it warns when the model lies farther
   along the line from Retrain to the original than exact retrains do; never decisive;
6. ``bound``: the method's certified bound, on the returned model's distance to Retrain, only
   when non-vacuous (below ``||M_0 - r||``);
7. ``utility``: test accuracy against Retrain's (or the original's, unless the original is
   poisoned);
8. ``deletion``: the forgotten clients' update payloads still held in the store, the deletion
   records, whether reads of deleted payloads fail, the page scan and rebuildable updates;
9. ``method_warnings``: the sentences a method put in ``details.warnings``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fedunlearn.errors import ConfigError
from fedunlearn.eval.distance_band import DistanceBand, upper_bound
from fedunlearn.eval.markers import MarkerEvidence
from fedunlearn.eval.mia.client import ClientMembershipEvidence
from fedunlearn.unlearn.lineage import Lineage
from fedunlearn.unlearn.receipt import BoundReport, Check, Verdict, Verification

__all__ = [
    "CHECK_NAMES",
    "POISONING_KINDS",
    "Evidence",
    "VerificationThresholds",
    "auc_standard_error",
    "build_verification",
]

CHECK_NAMES = (
    "backdoor",
    "membership",
    "client_membership",
    "markers",
    "poisoning",
    "distance",
    "bound",
    "utility",
    "deletion",
    "method_warnings",
)
CHANCE_AUC = 0.5
# attacks whose damage is the accuracy they cost (no trigger to test)
POISONING_KINDS = ("label_flip", "trim_random", "fang_trim")


class VerificationThresholds(BaseModel):
    """Thresholds of the receipt's checks (defaults calibrated in docs/verification.md).

    Every "excess" is the judged model's value minus the reference's: Retrain's when a Retrain
    reference exists, otherwise the stated fallback.

    Attributes:
        backdoor_warn: Excess backdoor ASR (absolute, in [0, 1]) above which the backdoor check
            warns.
        backdoor_fail: Excess backdoor ASR above which it fails (the backdoor visibly survives).
        mia_auc_warn: Excess membership AUC (each attack against the same attack on Retrain;
            the fallback reference is chance, 0.5) above which the membership check warns.
        mia_auc_fail: Excess membership AUC above which it fails.
        mia_warn_z: The excess must also exceed this many standard errors of the AUC on the
            attacked sample sizes (Hanley-McNeil) to warn: sampling noise is not a trace.
        mia_fail_z: Standard errors the excess must exceed to fail.
        distance_pass: Relative distance ``||u - r|| / ||o - r||`` at or below which the
            distance check passes when no band of independent exact retrains was measured
            (the original is at 1.0 and the original plus noise farther; exact retrains with
            other batch orders land at 0.47-0.68 for an honest client of the quickstart).
        distance_toward: Share of the way from Retrain to the original, along their
            difference (``<u - r, o - r> / ||o - r||^2``: 0 at Retrain, 1 at the original,
            lambda for the weight interpolation ``lambda o + (1 - lambda) r``), above which the
            distance check warns when no independent exact retrains were measured (their
            spread sets the line otherwise). An exact retrain with other batch orders,
            ``r' = r + n' - n``, lies at about ``E||n||^2 / (||d||^2 + 2 E||n||^2)`` (``d``
            the influence), below 0.5 and near it when the batch-order noise dominates
            (measured: 0.004-0.03 for backdoor attackers, 0.01-0.09 for an honest client of
            the quickstart, 0.30-0.31 for one of the reduced MNIST CNN); a measured line is
            capped at this value.
        distance_unchanged: If the model moved less than this share of the original-to-Retrain
            gap away from the original, the distance check fails: it is still the original
            model (its relative distance is then at least ``1 - distance_unchanged``).
        bound_tolerance: Relative slack when comparing an observed distance with a certified
            bound (float rounding).
        marker_warn: Excess marker rate (share of marked probe inputs classified as the
            client's target) over the clean reference (Retrain's rate, else the model's rate
            for never-embedded decoy patterns) above which the markers check warns; it must
            also exceed 3 binomial standard errors.
        marker_fail: Excess marker rate above which it fails (and 4 standard errors).
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
    mia_auc_warn: float = Field(0.05, ge=0, le=0.5)
    mia_auc_fail: float = Field(0.10, ge=0, le=0.5)
    mia_warn_z: float = Field(3.0, ge=0)
    mia_fail_z: float = Field(4.0, ge=0)
    distance_pass: float = Field(0.5, gt=0, lt=1)
    distance_unchanged: float = Field(0.1, ge=0, le=1)
    distance_toward: float = Field(0.4, gt=0, lt=1)
    bound_tolerance: float = Field(1e-6, ge=0)
    utility_warn: float = Field(0.02, ge=0, le=1)
    utility_fail: float = Field(0.05, ge=0, le=1)
    marker_warn: float = Field(0.05, ge=0, le=1)
    marker_fail: float = Field(0.10, ge=0, le=1)
    deletion_on_forget: Literal["warn", "fail"] = "warn"
    method_warning: Literal["warn", "fail"] = "warn"

    def model_post_init(self, _context: Any) -> None:
        """Check each warn threshold is at most its fail threshold."""
        for name in ("backdoor", "mia_auc", "utility", "mia", "marker"):
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
        original: The original (final, not unlearned) model's row: the negative control.
        retrain: Retrain's row (the positive control), or None if none was computed.
        retrain_gap: ``||o - r||``, the original's distance to Retrain (None without Retrain).
        request_kind: ``forget`` (deletion request) or ``recover`` (poisoning).
        backdoor: Whether the run has a backdoor attack.
        attackers_forgotten: How many of the run's attacking clients the request removes.
        clients_forgotten: How many clients the request removes (0: unknown, taken as every
            one an attacker); with honest clients among them the backdoor check is not
            decisive.
        attackers_total: How many attacking clients the run has.
        bound: The method's certified bound, if it provides one.
        warnings: The method's own warnings (``details.warnings``).
        assumptions: What the method's result rests on (``details.assumptions``: e.g. a
            threat model); carried into the receipt verbatim, judged by no check.
        deletion: The store's deletion evidence (``deletion_evidence``), or None if no store
            was available.
        noisy_original: The row of the original plus small Gaussian noise (a second negative
            control), or None if not measured.
        noise_std: The standard deviation of that noise.
        clean_asr: Backdoor ASR measured on a clean model without Retrain (the initial model
            M_0), or None.
        initial_gap: ``||M_0 - r||``: a bound at least this large says nothing (None without
            Retrain).
        attack_kind: The run's attack (``backdoor``, ``label_flip``, ...; None: no attack).
        private_run: Whether the run was trained with DP (``privacy.enabled``).
        private_reference: Whether Retrain ran under the run's DP mechanism (a DP Retrain,
            ``reference_retrain`` on a DP run).
        client_membership: The client-level membership test's scores (label ``candidate`` is
            the judged model), or None if it was not run.
        warnings_available: False when the method's warnings were not available (an audited
            model without its result file).
        lineage: The result's lineage, or None when none was available.
        markers: The forgotten clients' participation-marker rates of the model and its
            controls, or None when no forgotten client embedded a marker.
        distance_band: The spread of independent exact retrains around Retrain (the
            distance check's pass line), or None: the fixed ``distance_pass`` applies.
        clean_path: The rows (``backdoor_asr``, ...) of Retrain's earlier global models
            (``clean_round_<t>``): clean models less trained than Retrain. A model less
            trained than every reference of the client-level test is compared with them
            (``_less_trained``).
    """

    row: Mapping[str, Any]
    original: Mapping[str, Any]
    retrain: Mapping[str, Any] | None = None
    retrain_gap: float | None = None
    request_kind: str = "forget"
    backdoor: bool = False
    attackers_forgotten: int = 0
    clients_forgotten: int = 0
    attackers_total: int = 0
    bound: BoundReport | None = None
    warnings: tuple[str, ...] = ()
    assumptions: tuple[str, ...] = ()
    deletion: Mapping[str, Any] | None = field(default=None)
    noisy_original: Mapping[str, Any] | None = None
    noise_std: float | None = None
    clean_asr: float | None = None
    initial_gap: float | None = None
    attack_kind: str | None = None
    private_run: bool = False
    client_membership: ClientMembershipEvidence | None = None
    warnings_available: bool = True
    lineage: Lineage | None = None
    markers: MarkerEvidence | None = None
    distance_band: DistanceBand | None = None
    private_reference: bool = False
    clean_path: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def controls(self) -> dict[str, Mapping[str, Any]]:
        """Return the negative controls' rows by label (the original, and with noise)."""
        out: dict[str, Mapping[str, Any]] = {"original": self.original}
        if self.noisy_original is not None:
            out[f"original + noise (std {self.noise_std:g})"] = self.noisy_original
        return out


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


def _clients(ev: Evidence) -> str:
    forgotten = (ev.deletion or {}).get("clients")
    if forgotten:
        return "client(s) " + ", ".join(str(c) for c in forgotten)
    return "the forgotten clients"


def _no_power(ev: Evidence, unflagged: list[str], detail: str) -> str:
    """Return the sentence of a check that cannot tell its negative control apart."""
    return (
        f"this test cannot tell the {unflagged[0]} from a model that never saw {_clients(ev)} "
        f"({detail}), so it shows nothing either way"
    )


def _controlled(
    candidate: Verdict, controls: dict[str, Verdict], positive: Verdict | None
) -> tuple[Verdict, list[str], bool]:
    """Return the verdict under the controls, the unflagged controls, the positive's flag.

    A flagged candidate stays ``fail`` (the threshold controls false flags); otherwise every
    negative control must be flagged and the positive control must not be, or the verdict is
    ``inconclusive``.
    """
    unflagged = [label for label, v in controls.items() if v != "fail"]
    positive_flagged = positive == "fail"
    if candidate == "fail":
        return "fail", unflagged, positive_flagged
    if unflagged or positive_flagged:
        return "inconclusive", unflagged, positive_flagged
    return candidate, unflagged, positive_flagged


def _less_trained(ev: Evidence) -> bool:
    """Whether the model is less trained than every reference of the client-level test.

    Such a model is off the ground the checks' lines were drawn on: an under-trained clean
    model can send triggered inputs to the target class, hit a marker's target, or score like a
    "with" model on its own (measured on the reduced MNIST CNN: Retrain stopped at half the
    rounds). The backdoor, markers and client-level checks then compare it with the least
    trained clean models the receipt measured, Retrain's earlier global models
    (``Evidence.clean_path``): it is flagged only beyond every one of them; without them a flag
    is ``warn`` (not cleared, never ``remains``). Unknown (no client-level test): False.
    """
    cm = ev.client_membership
    return cm is not None and cm.region("candidate") == "below"


def _less_trained_words(path: Mapping[str, Any], show: Callable[[float], str]) -> str:
    """The reason a flag on a less-trained model is only a warning."""
    if not path:
        return (
            "; the model is less trained than every reference model and no clean model this "
            "little trained was measured (Retrain's earlier rounds: needs Retrain), so the flag "
            "is not evidence of the forgotten clients (an under-trained clean model can show "
            "it); not cleared"
        )
    top = max(float(v) for v in path.values())
    return (
        f"; the model is less trained than every reference model, and a clean, less trained "
        f"model comes as close ({_path_words(path)}: up to {show(top)}), so the flag is not "
        "evidence of the forgotten clients; not cleared"
    )


def _path_values(ev: Evidence, key: str) -> dict[str, float]:
    """The clean-path models' finite ``key`` values (``Evidence.clean_path``), by label."""
    values = {label: _num(row.get(key)) for label, row in ev.clean_path.items()}
    return {label: v for label, v in values.items() if v is not None}


def _path_words(labels: Iterable[str]) -> str:
    rounds = sorted(int(label.rsplit("_", 1)[1]) for label in labels)
    return "Retrain's rounds " + ", ".join(str(t) for t in rounds)


# --- 1. backdoor ------------------------------------------------------------------------------


def check_backdoor(ev: Evidence, th: VerificationThresholds) -> Check:
    """Check 1: the backdoor no longer works (ASR near Retrain's, or a measured clean ASR).

    The reference is Retrain's ASR; without Retrain, the clean ASR measured on the initial model
    M_0 when every attacker is forgotten, else ``inconclusive`` (other attackers keep the
    backdoor alive; only Retrain says how much). The original (and the original plus noise)
    must exceed the fail line, or the check is ``inconclusive``. When the request also names
    honest clients, a pass is not decisive (the ASR says nothing about them).
    """
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
        return Check(
            "backdoor", title, "inconclusive", reason="the backdoor ASR could not be measured"
        )
    if retrain is not None:
        base, base_name = retrain, "Retrain"
    elif ev.attackers_forgotten < ev.attackers_total:
        return Check(
            "backdoor",
            title,
            "inconclusive",
            asr,
            reference={"original": original},
            reason=(
                f"{ev.attackers_total - ev.attackers_forgotten} other backdoor client(s) stay in "
                f"the federation, so only a Retrain reference says what ASR to expect (ASR "
                f"{_pct(asr)}, {_pct(original)} before unlearning; --reference retrain)"
            ),
        )
    elif ev.clean_asr is not None:
        base, base_name = ev.clean_asr, "the untrained initial model M_0"
    else:
        return Check(
            "backdoor",
            title,
            "inconclusive",
            asr,
            reference={"original": original},
            reason="no clean ASR was measured (no Retrain, no initial model)",
        )
    reference = {"original": original, "retrain": retrain}
    if retrain is None:
        reference["clean_measured"] = base
    less = _less_trained(ev)
    path = _path_values(ev, "backdoor_asr")
    threshold = {"warn": base + th.backdoor_warn, "fail": base + th.backdoor_fail}
    if less and path:
        # a less-trained model is flagged only beyond the clean, less trained models too
        # (Retrain's earlier rounds); its pass still needs Retrain's ASR
        reference["clean_path"] = dict(path)
        threshold["fail"] = max(base, *path.values()) + th.backdoor_fail
    evidence = {
        "asr_forgotten_data": _num(ev.row.get("backdoor_asr_forgotten")),
        "original_asr_forgotten_data": _num(ev.original.get("backdoor_asr_forgotten")),
    }

    def grade(row: Mapping[str, Any]) -> Verdict:
        value = _num(row.get("backdoor_asr"))
        return "pass" if value is None else _grade(value - base, th.backdoor_warn, th.backdoor_fail)

    controls = {label: grade(row) for label, row in ev.controls().items()}
    positive = grade(ev.retrain) if ev.retrain is not None else None
    verdict, unflagged, positive_flagged = _controlled(grade(ev.row), controls, positive)
    top = max(path.values()) if path else None
    # the same arithmetic as ``grade``: beyond the highest clean, less trained model too
    demoted = (
        less
        and verdict == "fail"
        and (top is None or (top > base and asr - top <= th.backdoor_fail))
    )
    if demoted:
        verdict = "warn"
    power = {
        "original_flagged": controls["original"] == "fail",
        "controls": controls,
        "separation_points": 100 * (original - base),
        "fail_line_points": 100 * th.backdoor_fail,
        "less_trained": less,
    }
    if original - base > 0:
        evidence["share_removed"] = (original - asr) / (original - base)
    if verdict == "fail":
        reason = (
            f"the backdoor survives: ASR {_pct(asr)} on triggered test inputs against "
            f"{_pct(base)} for {base_name} ({_pct(original)} before unlearning)"
        )
    elif verdict == "inconclusive":
        reason = (
            _no_power(
                ev,
                unflagged,
                f"original ASR {_pct(original)} against {_pct(base)} for {base_name}; it flags "
                f"above {_pct(base + th.backdoor_fail)}",
            )
            if unflagged
            else "the test flags Retrain too"
        )
    elif verdict == "pass":
        reason = f"ASR {_pct(asr)} ({base_name}: {_pct(base)}; {_pct(original)} before unlearning)"
    else:
        reason = (
            f"part of the backdoor survives: ASR {_pct(asr)} against {_pct(base)} for "
            f"{base_name} ({_pct(original)} before unlearning)"
        )
    if demoted:
        reason += _less_trained_words(path, _pct)
    elif less and path and verdict == "fail":
        reason += (
            "; the model is less trained than every reference model, and above every clean, "
            f"less trained one too ({_path_words(path)}: ASR up to {_pct(max(path.values()))})"
        )
    # the ASR measures the attack only: with honest clients in the request too, its pass
    # says nothing about theirs (a model fine-tuned on an honest forgotten client passes)
    honest = ev.clients_forgotten - ev.attackers_forgotten
    if honest > 0 and verdict == "pass":
        reason += f"; it says nothing about the {honest} honest forgotten client(s)"
    return Check(
        "backdoor",
        title,
        verdict,
        asr,
        reference,
        threshold,
        reason,
        evidence=evidence,
        power=power,
        decisive=honest <= 0,
    )


# --- 2. membership ----------------------------------------------------------------------------


_ATTACKS = (("shadow", "mia_auc", "mia_samples"), ("loss", "mia_loss_auc", "mia_loss_samples"))
_SEVERITY_ORDER = {"pass": 0, "warn": 1, "fail": 2}


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
    ``mia_fail_z``) standard errors of the AUC on these sample sizes. The worse attack decides
    for the candidate; an attack counts as having power only if it flags every negative
    control (the original, and with noise). Without such an attack the check is
    ``inconclusive`` unless the candidate itself is flagged.
    """
    title = "membership"
    evidence: dict[str, Any] = {}
    graded = []
    powered = []
    power: dict[str, Any] = {}
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

        def grade(
            row: Mapping[str, Any] | None,
            key: str = key,
            base: float = base,
            warn: float = warn,
            fail: float = fail,
        ) -> Verdict:
            auc = _attack_auc(row, key)
            return "pass" if auc is None else _grade(auc - base, warn, fail)

        controls = {label: grade(row) for label, row in ev.controls().items()}
        original = _attack_auc(ev.original, key)
        evidence[f"{name}_auc"] = value
        evidence[f"{name}_reference"] = base
        evidence[f"{name}_original"] = original
        evidence[f"{name}_standard_error"] = se
        power[name] = {
            "original_flagged": controls["original"] == "fail",
            "controls": controls,
            "separation_se": ((original - base) / se if original is not None and se > 0 else None),
            "fail_line": base + fail,
        }
        candidate = grade(ev.row)
        graded.append((_SEVERITY_ORDER[candidate], value - base, name, value, base, warn, fail))
        if all(v == "fail" for v in controls.values()):
            powered.append(
                (_SEVERITY_ORDER[candidate], value - base, name, value, base, warn, fail)
            )
    if not graded:
        return Check("membership", title, "n/a", reason="no membership attack could be run")
    worst = max(graded)
    base_name = "Retrain" if ev.retrain is not None else "chance"
    if worst[0] == 2:  # a flag counts whatever the controls
        chosen, verdict = worst, "fail"
    elif powered:
        chosen = max(powered)
        verdict = {0: "pass", 1: "warn", 2: "fail"}[chosen[0]]
    else:
        chosen, verdict = worst, "inconclusive"
    _, _, name, value, base, warn, fail = chosen
    original = _attack_auc(ev.original, "mia_auc" if name == "shadow" else "mia_loss_auc")
    reference = {"original": original, "retrain": base if ev.retrain is not None else None}
    reference["chance"] = CHANCE_AUC
    threshold = {"warn": base + warn, "fail": base + fail}
    evidence["shadow_member_rate"] = _num(ev.row.get("mia_member_rate"))
    evidence["decided_by"] = name
    if verdict == "inconclusive":
        sep = power[name]["separation_se"]
        detail = (
            f"{name} attack AUC {original:.3f} on the original against {base:.3f} for "
            f"{base_name}"
            + (f", {sep:.1f} standard errors apart" if sep is not None else "")
            + f"; it flags above {base + fail:.3f}"
            if original is not None
            else "the original was not measured"
        )
        unflagged = [k for k, v in power[name]["controls"].items() if v != "fail"] or ["original"]
        reason = _no_power(ev, unflagged, detail)
    elif verdict == "pass":
        reason = f"{name} attack AUC {value:.3f}, {base_name} {base:.3f}" + (
            f" (the original {original:.3f} is flagged)" if original is not None else ""
        )
    else:
        reason = (
            f"the {name} attack still tells the forgotten clients' data from unseen data: AUC "
            f"{value:.3f} against {base:.3f} for {base_name}"
            + (f" ({original:.3f} before unlearning)" if original is not None else "")
        )
    return Check(
        "membership",
        title,
        verdict,
        value,
        reference,
        threshold,
        reason,
        evidence=evidence,
        power=power,
    )


# --- 3. client-level membership ---------------------------------------------------------------


def _fitness_words(cm: ClientMembershipEvidence, label: str) -> str:
    low, high = cm.domain or (math.nan, math.nan)
    side = "less" if cm.region(label) == "below" else "more"
    return (
        f"it is {side} trained than every reference model (mean logit confidence "
        f"{cm.fitness[label]:.3g} on the remaining clients' examples; references "
        f"{low:.3g} to {high:.3g})"
    )


def _envelope(cm: ClientMembershipEvidence) -> list[tuple[float, float]]:
    """The clean controls' (fitness, running-max score), by fitness; ties keep the highest."""
    points = sorted(
        (cm.fitness[k], cm.scores[k])
        for k in cm.scores
        if k.startswith("retrain")
        and k in cm.fitness
        and math.isfinite(cm.scores[k])
        and math.isfinite(cm.fitness[k])
    )
    envelope: list[tuple[float, float]] = []
    top = -math.inf
    for f, score in points:
        top = max(top, score)
        if envelope and envelope[-1][0] == f:
            envelope.pop()
        envelope.append((f, top))
    return envelope


def _clean_line(cm: ClientMembershipEvidence, fitness: float | None) -> float:
    """The flag line for a model of ``fitness``: the threshold plus the clean score growth.

    The clean controls (``retrain*``: Retrain, and Retrain trained 1 to 5 rounds more) with
    their fitness trace how a clean model's score grows with training. The line is the
    calibrated threshold plus that growth from the least fit control to ``fitness`` (the
    upper envelope of their scores, linear between controls, extended beyond the most fit
    one along its last segment; none below the least fit): a model is compared with clean
    models trained as much, with the references' spread already in the threshold. Without
    fitness (not measured): the highest of the threshold and every clean score.
    """
    if fitness is None or not cm.fitness:
        clean = [v for k, v in cm.scores.items() if k.startswith("retrain") and math.isfinite(v)]
        return max([cm.threshold, *clean])
    envelope = _envelope(cm)
    if not envelope or fitness <= envelope[0][0]:
        return cm.threshold
    base = envelope[0][1]
    last_f, last_s = envelope[-1]
    if fitness >= last_f:
        slope = 0.0
        if len(envelope) > 1:
            prev_f, prev_s = envelope[-2]
            slope = max(0.0, (last_s - prev_s) / (last_f - prev_f))
        level = last_s + slope * (fitness - last_f)
    else:
        level = base
        for (f0, s0), (f1, s1) in zip(envelope, envelope[1:], strict=False):
            if f0 <= fitness <= f1:
                level = s0 + (s1 - s0) * (fitness - f0) / (f1 - f0)
                break
    return cm.threshold + max(0.0, level - base)


def _line_words(cm: ClientMembershipEvidence, line: float, region: str) -> str:
    if region == "below":
        path = " every clean less trained one measured," if _path_scores(cm) else ""
        return f"{line:.3g} (every model trained with them,{path} and the calibrated threshold)"
    if region == "unknown" and line > cm.threshold:
        return f"{line:.3g} (the highest clean control; no fitness was measured)"
    if line > cm.threshold:
        return (
            f"{line:.3g} (the calibrated threshold {cm.threshold:.3g} plus what training as "
            "much as the model adds to a clean model's score, from the clean controls)"
        )
    return f"{line:.3g} (the calibrated threshold)"


def _client_line(cm: ClientMembershipEvidence, label: str) -> float:
    """The score above which the test flags ``label``, by where its fitness lies.

    Within the references' fitness range, trained more than them, or unmeasured: the clean
    line at its fitness (``_clean_line``); trained less than every reference: the calibrated
    threshold and every "with" reference's score; not a finite fitness: never (inf).
    """
    region = cm.region(label)
    if region in ("within", "above", "unknown"):
        return _clean_line(cm, cm.fitness.get(label) if region != "unknown" else None)
    if region == "below" and cm.in_max is not None and math.isfinite(cm.in_max):
        return max(cm.threshold, cm.in_max, *_path_scores(cm).values())
    return math.inf


def _path_scores(cm: ClientMembershipEvidence) -> dict[str, float]:
    """The scores of Retrain's earlier global models (clean, less trained), finite ones."""
    return {k: v for k, v in cm.scores.items() if k.startswith("clean_round_") and math.isfinite(v)}


def check_client_membership(ev: Evidence, th: VerificationThresholds) -> Check:
    """Check 3: the client-level membership test no longer flags the model.

    Reads ``Evidence.client_membership``. The score rises with any training that makes a
    model more confident, not only with membership, so a model is judged by its fitness
    (``ClientMembershipEvidence.fitness``: its mean logit confidence on the remaining clients'
    examples) against the reference models' range (``region``):

    - within the range or trained more: flagged above the line at its fitness
      (``_clean_line``): the calibrated threshold, raised to the upper envelope of the clean
      controls (``retrain*``: Retrain, Retrain trained 1 to 5 rounds more) no more fit than
      the model plus the references' spread. A model trained more than every reference and
      not flagged gets ``inconclusive``, never pass;
    - less trained than every reference: such a model looks like a "with" model on examples
      whose label a clean model finds unlikely (an attacker's poisoned labels, marked copies),
      so it is flagged only above every "with" reference and every clean, less trained model
      measured (Retrain's earlier global models, ``clean_round_<t>``; a model fine-tuned on
      the client scores there); without those clean models such a flag is ``warn`` (on the
      reduced MNIST CNN, Retrain stopped at half the rounds scored above every "with"
      reference); otherwise ``warn`` above the calibrated threshold (not cleared, never
      ``remains``), else ``inconclusive``;
    - a NaN score or fitness: ``inconclusive``.

    The original (and ``original*`` copies), judged by the same rule, must be flagged, or a
    model below its line gets ``inconclusive``. Without a measured range (older evidence)
    every model is judged against the calibrated threshold and every clean control's score.
    """
    title = "client-level membership"
    cm = ev.client_membership
    if cm is None:
        return Check(
            "client_membership",
            title,
            "n/a",
            reason="the client-level membership test was not run",
        )
    if "candidate" not in cm.scores or "original" not in cm.scores:
        return Check(
            "client_membership",
            title,
            "inconclusive",
            reason="the test did not score both the model and the original",
        )
    value = cm.scores["candidate"]
    clean = {k: v for k, v in cm.scores.items() if k.startswith("retrain")}
    region = cm.region("candidate")
    applied = _client_line(cm, "candidate")
    line = cm.threshold if region == "below" else applied
    # the negative controls must be flagged at the line the candidate faces, and at their own
    # (an original less trained than the references scores high without the clients' help)
    controls: dict[str, Verdict] = {
        label: "fail" if cm.scores[label] > max(applied, _client_line(cm, label)) else "pass"
        for label in cm.scores
        if label.startswith("original")
    }
    candidate: Verdict = "fail" if value > applied else "pass"
    # the positive control: Retrain, at the line of its own fitness
    positive: Verdict | None = None
    if "retrain" in cm.scores and math.isfinite(cm.scores["retrain"]):
        positive = "fail" if cm.scores["retrain"] > _client_line(cm, "retrain") else "pass"
    verdict, unflagged, positive_flagged = _controlled(candidate, controls, positive)
    if verdict == "fail" and positive_flagged:
        verdict = "warn"  # the test flags a clean Retrain too: not cleared, not shown to remain
    path = _path_scores(cm) if region == "below" else {}
    # less trained than every reference and no clean model as little trained measured: a
    # flag above every "with" reference is not enough (an under-trained CNN scores there)
    demoted = verdict == "fail" and region == "below" and not path
    if demoted:
        verdict = "warn"
    off_range = verdict != "fail" and region in ("below", "above")
    invalid = not math.isfinite(value) or region == "invalid"
    if invalid:
        verdict = "inconclusive"
    elif off_range:
        # above the calibrated line it is not cleared (warn), never `remains`
        verdict = "warn" if region == "below" and value > cm.threshold else "inconclusive"
    clean_flagged = sorted(k for k, v in clean.items() if v > cm.threshold)
    reference = {k: v for k, v in cm.scores.items() if k != "candidate"}
    threshold = {
        "fail": applied,
        "line": line,
        "calibrated": cm.threshold,
        "target_fpr": cm.target_fpr,
    }
    power = {
        "original_flagged": controls["original"] == "fail",
        "controls": controls,
        "retrain_flagged": positive_flagged,
        "clean_controls_above_threshold": clean_flagged,
        "power": cm.power,
        "reference_models": cm.num_reference_models,
    }
    evidence: dict[str, Any] = {
        "cost_seconds": cm.cost_seconds,
        "cost_client_epochs": cm.cost_client_epochs,
    }
    if cm.domain is not None:
        evidence["fitness"] = dict(cm.fitness)
        evidence["reference_fitness_range"] = list(cm.domain)
        evidence["region"] = region
        evidence["in_max"] = cm.in_max
    if path:
        evidence["clean_path"] = dict(path)
    if invalid:
        reason = (
            f"the model's score ({value:.3g}) or its fitness on the remaining clients' examples "
            "is not a finite number (NaN or infinite outputs): the test cannot place it"
        )
    elif positive_flagged:
        reason = (
            f"Retrain, which never saw {_clients(ev)}, scores {cm.scores['retrain']:.3g}, above "
            "its own flag line: the test flags a clean model here, so its "
            + ("flag of this model (score " if verdict == "warn" else "pass of this model (score ")
            + f"{value:.3g}, line {applied:.3g}) shows nothing either way"
        )
    elif demoted:
        reason = (
            f"{_fitness_words(cm, 'candidate')}: it scores {value:.3g}, above every model "
            f"trained with {_clients(ev)} ({applied:.3g}), but no clean model this little "
            "trained was measured (Retrain's earlier rounds: needs Retrain), and an "
            "under-trained clean model can score there too; not cleared"
        )
    elif verdict == "fail":
        beyond = ""
        if region == "below":
            beyond = (
                f"; {_fitness_words(cm, 'candidate')}, yet above every model trained with them "
                f"({cm.in_max:.3g}) and every clean, less trained one ({_path_words(path)}: "
                f"up to {max(path.values()):.3g})"
            )
        elif region == "above":
            beyond = f"; {_fitness_words(cm, 'candidate')}, yet above the clean models"
        reason = (
            f"the test still finds {_clients(ev)} in the model: score {value:.3g} above "
            f"{_line_words(cm, applied, region)} (original {cm.scores['original']:.3g}){beyond}"
        )
    elif off_range and verdict == "warn":
        flag_words = (
            f"it would be flagged above every model trained with them and every clean, less "
            f"trained one measured, {applied:.3g}"
            if _path_scores(cm)
            else "no clean model this little trained was measured, so no score flags it"
        )
        reason = (
            f"{_fitness_words(cm, 'candidate')}: it scores {value:.3g}, above the calibrated "
            f"threshold {cm.threshold:.3g} that flags a model trained as the run was, but a "
            f"less trained model scores high on these examples without {_clients(ev)} "
            f"({flag_words}); not cleared"
        )
    elif off_range:
        reason = (
            f"{_fitness_words(cm, 'candidate')}: the test is calibrated on models trained as the "
            f"run was, and its score ({value:.3g}; line {applied:.3g}) says nothing either way "
            "about such a model"
        )
    elif verdict == "inconclusive":
        first = unflagged[0]
        detail = (
            f"{first} score {cm.scores[first]:.3g}, at or below the model's flag line "
            f"{_line_words(cm, applied, region)}"
        )
        reason = _no_power(ev, unflagged, detail)
    else:
        reason = (
            f"score {value:.3g} below {_line_words(cm, applied, region)} (original "
            f"{cm.scores['original']:.3g}, above it; power "
            f"{cm.power if cm.power is not None else 'not measured'})"
        )
    return Check(
        "client_membership",
        title,
        verdict,
        value,
        reference,
        threshold,
        reason,
        evidence=evidence,
        power=power,
    )


# --- 3b. participation markers ----------------------------------------------------------------


def _marker_grade(
    excess: float, base: float, probes: int, th: VerificationThresholds
) -> tuple[Verdict, float, float]:
    """Return the verdict of a marker-rate excess and the warn / fail margins used.

    The margins are the fixed thresholds or 3 / 4 binomial standard errors of a difference of
    two rates on ``probes`` inputs at the reference rate, whichever is larger.
    """
    p = min(max(base, 1.0 / max(probes, 1)), 1.0 - 1.0 / max(probes, 1))
    se = math.sqrt(2 * p * (1 - p) / max(probes, 1))
    warn, fail = max(th.marker_warn, 3 * se), max(th.marker_fail, 4 * se)
    return _grade(excess, warn, fail), warn, fail


def check_markers(ev: Evidence, th: VerificationThresholds) -> Check:
    """Check 3b: the forgotten clients' participation markers no longer work.

    Per marked forgotten client, the marker rate (marked probe inputs classified as the
    client's secret target) is judged against Retrain's rate for the same marker. Without
    Retrain the reference is the same model's rate for never-embedded decoy patterns: a rate
    within the warn margin of it passes, and a model is flagged only if it also keeps the
    original's rate (within the fail margin), since a clean model's rate for this pattern can
    exceed the decoys'; in between it warns. The worst client decides. The
    original (and the original plus noise) must be flagged for every marked client, and
    Retrain must not be, or a model that is not flagged gets ``inconclusive``.
    """
    title = "participation markers"
    mk = ev.markers
    if mk is None or not mk.clients:
        return Check(
            "markers",
            title,
            "n/a",
            reason=(
                "no forgotten client embedded a participation marker (verification.markers in "
                "the run config)"
            ),
        )
    with_retrain = "retrain" in mk.rates
    less = _less_trained(ev)
    # a model less trained than the references is flagged only beyond the clean, less
    # trained models too (Retrain's earlier rounds); its pass still needs Retrain's rate
    path = [label for label in mk.rates if label.startswith("clean_round_")] if less else []

    def grade(label: str) -> tuple[Verdict, dict[int, dict[str, Any]]]:
        worst: Verdict = "pass"
        per: dict[int, dict[str, Any]] = {}
        for c in mk.clients:
            rate = mk.rates[label][c]
            base = mk.rates["retrain"][c] if with_retrain else mk.decoy_rates[label][c]
            verdict, warn, fail = _marker_grade(rate - base, base, mk.probes[c], th)
            per[c] = {"rate": rate, "reference": base, "warn": base + warn, "fail": base + fail}
            if not with_retrain and verdict == "fail":
                # a clean model's rate for this very pattern can sit well above the decoys'
                # (measured: 28% against 7%), so without Retrain only a model that kept about
                # the original's rate is flagged; in between, part of the marker may remain
                keeps = mk.rates["original"][c] - fail
                per[c]["fail"] = max(base + fail, keeps)
                if rate < keeps:
                    verdict = "warn"
            if label == "candidate" and less:
                # flagged only beyond every clean, less trained model too (same arithmetic
                # as the grade above); a flag short of that is only a warning
                per[c]["clean_path_top"] = None
                if path:
                    top = max(mk.rates[p][c] for p in path)
                    per[c]["clean_path_top"] = top
                    if top > base:
                        beyond, _, margin = _marker_grade(rate - top, top, mk.probes[c], th)
                        per[c]["fail"] = max(per[c]["fail"], top + margin)
                        per[c]["demoted"] = verdict == "fail" and beyond != "fail"
                else:
                    per[c]["demoted"] = verdict == "fail"
            if _SEVERITY_ORDER[verdict] > _SEVERITY_ORDER[worst]:
                worst = verdict
            per[c]["flagged"] = verdict == "fail"
        return worst, per

    candidate, per_client = grade("candidate")
    graded = {label: grade(label) for label in mk.rates if label != "candidate"}
    controls: dict[str, Verdict] = {
        label: "fail" if all(p["flagged"] for p in per.values()) else "pass"
        for label, (_, per) in graded.items()
        if label.startswith("original")
    }
    if "original" not in controls:
        return Check(
            "markers", title, "inconclusive", reason="the original's marker rate was not measured"
        )
    positive = graded["retrain"][0] if with_retrain else None
    verdict, unflagged, positive_flagged = _controlled(candidate, controls, positive)
    flagged = [c for c, p in per_client.items() if p["flagged"]]
    demoted = [c for c in flagged if per_client[c].get("demoted")]
    if verdict == "fail" and flagged and len(demoted) == len(flagged):
        verdict = "warn"  # every flag is on a less trained model a clean one comes as close to
    excess = {c: p["rate"] - p["reference"] for c, p in per_client.items()}
    # the client named is a flagged one (not demoted) first, else the largest excess
    named = [c for c in flagged if c not in demoted] or flagged or list(excess)
    worst_client = max(named, key=lambda c: excess[c])
    value = per_client[worst_client]["rate"]
    base_name = "Retrain" if with_retrain else "never-embedded decoy patterns"
    reference = {
        "original": {c: mk.rates["original"][c] for c in mk.clients},
        "retrain": {c: mk.rates["retrain"][c] for c in mk.clients} if with_retrain else None,
        "decoy": {c: mk.decoy_rates["candidate"][c] for c in mk.clients},
    }
    if path:
        reference["clean_path"] = {p: dict(mk.rates[p]) for p in path}
    threshold = {
        "warn": {c: p["warn"] for c, p in per_client.items()},
        "fail": {c: p["fail"] for c, p in per_client.items()},
    }
    power = {
        "original_flagged": controls["original"] == "fail",
        "controls": controls,
        "separation_points": {
            c: 100 * (graded["original"][1][c]["rate"] - graded["original"][1][c]["reference"])
            for c in mk.clients
        },
    }
    evidence = {"per_client": per_client, "probes": dict(mk.probes)}
    shown = ", ".join(
        f"client {c} {_pct(p['rate'])} (reference {_pct(p['reference'])}, original "
        f"{_pct(mk.rates['original'][c])})"
        for c, p in per_client.items()
    )
    if verdict == "fail":
        reason = (
            f"client {worst_client}'s marker still works: {_pct(value)} of marked probe inputs "
            f"go to its target against {_pct(per_client[worst_client]['reference'])} for "
            f"{base_name} ({_pct(mk.rates['original'][worst_client])} before unlearning)"
        )
        top = per_client[worst_client].get("clean_path_top")
        if less and top is not None:
            reason += (
                "; the model is less trained than every reference model, and beyond every "
                f"clean, less trained one too ({_path_words(path)}: up to {_pct(top)})"
            )
    elif verdict == "inconclusive":
        reason = (
            _no_power(ev, unflagged, f"marker rates {shown}; reference: {base_name}")
            if unflagged
            else f"the markers flag Retrain too ({shown})"
        )
    elif verdict == "pass":
        reason = f"marker rates {shown}; reference: {base_name}"
    else:
        reason = f"part of a marker still works: {shown}; reference: {base_name}"
    if demoted and verdict == "warn":
        top = {p: max(mk.rates[p][c] for c in demoted) for p in path}
        reason += _less_trained_words(top, _pct)
    power["less_trained"] = less
    return Check(
        "markers",
        title,
        verdict,
        value,
        reference,
        threshold,
        reason,
        evidence=evidence,
        power=power,
    )


# --- 4. non-backdoor poisoning ----------------------------------------------------------------


def _poisoning_applies(ev: Evidence) -> bool:
    return ev.attack_kind in POISONING_KINDS and ev.attackers_forgotten > 0


def check_poisoning(ev: Evidence, th: VerificationThresholds) -> Check:
    """Check 4: a non-backdoor poisoning's damage is gone (accuracy near Retrain's).

    Label flipping and model poisoning (trim, Fang) show their influence as lost accuracy, so
    the candidate is judged against Retrain, never the poisoned original; the original must
    fall below the fail line, or the check is ``inconclusive``. Without Retrain:
    ``inconclusive`` (no clean reference).
    """
    title = "poisoning removed"
    if not _poisoning_applies(ev):
        return Check(
            "poisoning",
            title,
            "n/a",
            reason="no forgotten client ran a non-backdoor poisoning attack",
        )
    acc = _num(ev.row.get("test_accuracy"))
    original = _num(ev.original.get("test_accuracy"))
    retrain = _num(ev.retrain.get("test_accuracy")) if ev.retrain is not None else None
    if retrain is None or acc is None or original is None:
        return Check(
            "poisoning",
            title,
            "inconclusive",
            acc,
            {"original": original},
            reason=(
                f"the original is poisoned ({ev.attack_kind}): only a Retrain reference says "
                "what accuracy a clean model reaches (--reference retrain)"
            ),
        )

    def grade(row: Mapping[str, Any]) -> Verdict:
        value = _num(row.get("test_accuracy"))
        return (
            "pass" if value is None else _grade(retrain - value, th.utility_warn, th.utility_fail)
        )

    controls = {label: grade(row) for label, row in ev.controls().items()}
    verdict, unflagged, _ = _controlled(grade(ev.row), controls, None)
    reference: dict[str, Any] = {"original": original, "retrain": retrain}
    threshold = {"warn": retrain - th.utility_warn, "fail": retrain - th.utility_fail}
    # a less-trained model is less accurate without any poisoning: it is flagged only below
    # every clean, less trained model too (Retrain's earlier rounds), else a flag is a warning
    less = _less_trained(ev)
    path = _path_values(ev, "test_accuracy")
    demoted = False
    if less:
        low = min(path.values()) if path else None
        if low is not None:
            reference["clean_path"] = dict(path)
            threshold["fail"] = min(threshold["fail"], low - th.utility_fail)
        demoted = verdict == "fail" and (
            low is None or (low < retrain and low - acc <= th.utility_fail)
        )
        if demoted:
            verdict = "warn"
    power = {
        "original_flagged": controls["original"] == "fail",
        "controls": controls,
        "separation_points": 100 * (retrain - original),
    }
    if verdict == "fail":
        reason = (
            f"the poisoning's damage remains: test accuracy {_pct(acc)} against {_pct(retrain)} "
            f"for Retrain ({_pct(original)} before unlearning)"
        )
    elif verdict == "inconclusive":
        reason = _no_power(
            ev,
            unflagged,
            f"the original's accuracy {_pct(original)} against Retrain's {_pct(retrain)}",
        )
    elif verdict == "warn":
        reason = f"test accuracy {_pct(acc)}, Retrain {_pct(retrain)}: part of the damage remains"
    else:
        reason = f"test accuracy {_pct(acc)}, Retrain {_pct(retrain)} (original {_pct(original)})"
    if demoted:
        reason += (
            _less_trained_words(path, _pct)
            if not path
            else (
                "; the model is less trained than every reference model, and a clean, less "
                f"trained model is as inaccurate ({_path_words(path)}: down to "
                f"{_pct(min(path.values()))}), so the drop is not evidence of the poisoning; "
                "not cleared"
            )
        )
    power["less_trained"] = less
    return Check("poisoning", title, verdict, acc, reference, threshold, reason, power=power)


# --- 5. distance ------------------------------------------------------------------------------


MIN_TOWARD_RETRAINS = 3  # with 2, the 95% Student-t factor is 6.3 x the spread


def _toward_line(ev: Evidence, th: VerificationThresholds) -> tuple[float, str]:
    """Return the line of the share toward the original, and where it comes from.

    The 95% prediction bound of at least ``MIN_TOWARD_RETRAINS`` exact retrains' positions,
    capped at ``distance_toward``; the fixed ``distance_toward`` when fewer were measured.
    """
    band = ev.distance_band
    cm = ev.client_membership
    candidates = (
        (band.toward if band is not None else (), "independent exact retrains (distance band)"),
        (
            cm.reference_toward if cm is not None else (),
            "exact retrains (the client-level test's references trained without the clients)",
        ),
    )
    for measured, where in candidates:
        finite = [float(v) for v in measured if math.isfinite(v)]
        if len(finite) >= MIN_TOWARD_RETRAINS:
            bound = upper_bound(finite)
            line = min(bound, th.distance_toward)
            capped = f", capped at distance_toward {th.distance_toward:g}" if bound > line else ""
            return line, (
                f"{len(finite)} {where} lie at {min(finite):.2f} to {max(finite):.2f} (95% "
                f"prediction bound {bound:.2f}{capped})"
            )
    return th.distance_toward, (
        f"the fixed line distance_toward ({th.distance_toward:g}; fewer than "
        f"{MIN_TOWARD_RETRAINS} exact retrains were measured)"
    )


def check_distance(ev: Evidence, th: VerificationThresholds) -> Check:
    """Check 5: the model left the original and came close to Retrain.

    Fails a model that moved less than ``distance_unchanged`` of the original-to-Retrain gap
    (the original plus small noise included). The pass line is the band of independent exact
    retrains (``Evidence.distance_band``: where another exact retrain lands), else the fixed
    ``distance_pass``; a model within it passes only if the original (and the original plus
    noise) lies outside it, else ``inconclusive``; beyond it ``inconclusive``. Never decisive:
    an interpolation of the original and Retrain is close too.

    It also measures where the model lies along the line from Retrain to the original
    (``<u - r, o - r> / ||o - r||^2``, from the three distances): a model that keeps more of
    the original's offset than independent exact retrains do (their 95% prediction bound,
    from the distance band or the client-level test's "without" references, else the fixed
    ``distance_toward``) gets ``warn``, so no other check's pass makes its influence
    ``removed``: the half-way weight interpolation of the original and Retrain lies at 0.5
    and can pass the backdoor and membership checks.
    """
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
                decisive=False,
            )
        return Check(
            "distance",
            title,
            "n/a",
            reason="no Retrain reference was computed (--reference retrain computes one)",
            evidence={"distance_to_original": moved},
            decisive=False,
        )
    left = _num(ev.row.get("distance_to_retrain"))
    gap = ev.retrain_gap
    if left is None or moved is None:
        return Check(
            "distance", title, "n/a", reason="the distances could not be measured", decisive=False
        )
    evidence = {"distance_to_retrain": left, "distance_to_original": moved, "original_gap": gap}
    threshold = {"pass": th.distance_pass, "unchanged": th.distance_unchanged}
    if gap == 0.0:
        verdict: Verdict = "pass" if left == 0.0 else "inconclusive"
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
            decisive=False,
        )
    relative = left / gap
    moved_share = moved / gap
    measured_toward = _num(ev.row.get("toward_original"))
    toward = measured_toward if measured_toward is not None else _toward(left, moved, gap)
    toward_line, toward_source = _toward_line(ev, th)
    evidence["moved_share_of_gap"] = moved_share
    evidence["toward_original"] = toward
    reference = {"original": 1.0, "retrain": 0.0}
    power: dict[str, Any] = {}
    for label, row in ev.controls().items():
        c_left = _num(row.get("distance_to_retrain"))
        c_moved = _num(row.get("distance_to_original"))
        if c_left is not None and c_moved is not None:
            c_toward = _num(row.get("toward_original"))
            power[label] = {
                "relative": c_left / gap,
                "flagged": c_moved / gap < th.distance_unchanged,
                "toward_original": c_toward
                if c_toward is not None
                else _toward(c_left, c_moved, gap),
            }
    band = ev.distance_band
    line = band.band if band is not None else th.distance_pass
    source = (
        f"the spread of {len(band.relative)} independent exact retrains (at "
        f"{min(band.relative):.2f}-{max(band.relative):.2f}x; {band.level:.0%} prediction "
        f"bound {line:.2f}x)"
        if band is not None
        else f"the fixed pass line distance_pass ({line:g}x; no band was measured)"
    )
    if band is not None:
        threshold["pass"] = line
        evidence["band"] = band.to_dict()
        for entry in power.values():
            entry["outside_band"] = entry["relative"] > line
    inside = [label for label, p in power.items() if not p.get("outside_band", True)]
    threshold["toward"] = toward_line
    if moved_share < th.distance_unchanged:
        verdict = "fail"
        reason = (
            f"the model is still the original model: it moved {moved_share:.1%} of the "
            f"original-to-Retrain gap ({relative:.2f} of the original's distance to Retrain)"
        )
    elif not toward < toward_line:  # NaN included: it cannot be placed, so it is not cleared
        verdict = "warn"
        reason = (
            f"it keeps {toward:.2f} of the original's offset from Retrain (its position along "
            f"the line from Retrain, 0, to the original, 1), at or beyond {toward_line:.2f}, "
            f"where exact retrains stop: {toward_source}; part of the forgotten clients' "
            "influence may remain where the other checks do not look (the half-way weight "
            "average of the original and Retrain is at 0.50)"
        )
    elif relative <= line and inside:
        verdict = "inconclusive"
        reason = _no_power(
            ev,
            inside,
            f"it lies at {power[inside[0]]['relative']:.2f}x, inside {source}",
        )
    elif relative <= line:
        verdict = "pass"
        reason = (
            f"{relative:.2f} of the original's distance to Retrain, within {source}; distance "
            "alone does not show removal"
        )
    else:
        verdict = "inconclusive"
        reason = (
            f"{relative:.2f}x the original's distance from Retrain, beyond {source}: it cannot tell"
        )
    return Check(
        "distance",
        title,
        verdict,
        relative,
        reference,
        threshold,
        reason,
        evidence=evidence,
        power=power,
        decisive=False,
    )


def _toward(left: float, moved: float, gap: float) -> float:
    """``<u - r, o - r> / ||o - r||^2`` from ``||u - r||``, ``||u - o||`` and ``||o - r||``."""
    return (left * left + gap * gap - moved * moved) / (2.0 * gap * gap)


# --- 6. certified bound -----------------------------------------------------------------------


def check_bound(ev: Evidence, th: VerificationThresholds) -> Check:
    """Check 6: the returned model respects the method's certified bound, if non-vacuous.

    Checked only on the returned model's distance to Retrain (a distance the method measured
    on another model, e.g. before final tuning, is not the result's) and only when the bound
    is below ``||M_0 - r||``: a bound larger than the distance from the untrained initial
    model says nothing.
    """
    title = "certified bound"
    bound = ev.bound
    if bound is None:
        return Check("bound", title, "n/a", reason="the method certifies no bound", aspect="method")
    reference = {"bound": bound.bound, "name": bound.name, "to": bound.reference}
    evidence = {"method_observed": bound.observed, "note": bound.note}
    if bound.reference != "retrain":
        return Check(
            "bound",
            title,
            "n/a",
            reference=reference,
            aspect="method",
            evidence=evidence,
            reason=(
                f"{bound.name} is about the distance to {bound.reference}, not to the full "
                "Retrain; the receipt checks a bound only on the returned model against Retrain"
            ),
        )
    if ev.retrain is None or ev.initial_gap is None:
        return Check(
            "bound",
            title,
            "n/a",
            reference=reference,
            aspect="method",
            evidence=evidence,
            reason=f"{bound.name}: no Retrain reference to measure it on (--reference retrain)",
        )
    reference["initial_to_retrain"] = ev.initial_gap
    if bound.bound >= ev.initial_gap:
        return Check(
            "bound",
            title,
            "n/a",
            reference=reference,
            aspect="method",
            evidence=evidence,
            reason=(
                f"{bound.name} is vacuous: {bound.bound:.4g} is not below the distance "
                f"{ev.initial_gap:.4g} from the initial model M_0 to Retrain"
            ),
        )
    observed = _num(ev.row.get("distance_to_retrain"))
    if observed is None:
        return Check(
            "bound",
            title,
            "n/a",
            reference=reference,
            aspect="method",
            evidence=evidence,
            reason=f"{bound.name}: the distance to Retrain was not measured",
        )
    limit = bound.bound * (1 + th.bound_tolerance)
    threshold = {"max": limit}
    if observed <= limit:
        reason = f"{bound.name}: distance to Retrain {observed:.4g} <= bound {bound.bound:.4g}"
        return Check(
            "bound",
            title,
            "pass",
            observed,
            reference,
            threshold,
            reason,
            "model",
            evidence,
            aspect="method",
        )
    reason = (
        f"{bound.name} does not hold: the returned model's distance {observed:.4g} to Retrain "
        f"exceeds the certified {bound.bound:.4g}"
    )
    return Check(
        "bound",
        title,
        "fail",
        observed,
        reference,
        threshold,
        reason,
        "model",
        evidence,
        aspect="method",
    )


# --- 7. utility -------------------------------------------------------------------------------


def check_utility(ev: Evidence, th: VerificationThresholds) -> Check:
    """Check 7: test accuracy stays near Retrain's (or the original's, if it is not poisoned)."""
    title = "utility"
    acc = _num(ev.row.get("test_accuracy"))
    original = _num(ev.original.get("test_accuracy"))
    retrain = _num(ev.retrain.get("test_accuracy")) if ev.retrain is not None else None
    dp_note = (
        "; Retrain trains without the run's DP noise, so part of a DP method's drop is the "
        "cost of privacy"
        if ev.private_run and retrain is not None and not ev.private_reference
        else "; Retrain ran under the run's DP mechanism (a DP Retrain)"
        if ev.private_run and retrain is not None
        else ""
    )
    if retrain is not None:
        base, base_name = retrain, "Retrain"
    elif _poisoning_applies(ev):
        return Check(
            "utility",
            title,
            "n/a",
            acc,
            {"original": original},
            aspect="utility",
            reason=(
                f"the original is poisoned ({ev.attack_kind}): its accuracy is no reference; "
                "--reference retrain gives a clean one"
            ),
        )
    else:
        base, base_name = original, "the original"
    if acc is None or base is None:
        return Check(
            "utility", title, "n/a", reason="test accuracy could not be measured", aspect="utility"
        )
    reference = {"original": original, "retrain": retrain}
    threshold = {"warn": base - th.utility_warn, "fail": base - th.utility_fail}
    drop = base - acc
    verdict = _grade(drop, th.utility_warn, th.utility_fail)
    if verdict == "pass":
        reason = f"test accuracy {_pct(acc)}, {base_name} {_pct(base)}{dp_note}"
    else:
        reason = (
            f"test accuracy {_pct(acc)} is {100 * drop:.1f} points below {base_name} "
            f"({_pct(base)}){dp_note}"
        )
    return Check("utility", title, verdict, acc, reference, threshold, reason, aspect="utility")


# --- 8. deletion ------------------------------------------------------------------------------


def _when(seconds: Any) -> str:
    try:
        return datetime.fromtimestamp(float(seconds), UTC).strftime("%Y-%m-%d %H:%M UTC")
    except (TypeError, ValueError, OverflowError):
        return "an unknown time"


def check_deletion(ev: Evidence, th: VerificationThresholds) -> Check:
    """Check 8: the forgotten clients' stored updates are deleted and cannot be read back.

    Reads, where the store's evidence has them, ``page_scan`` (fragments of deleted payloads
    found in the database files; a scan that did not run leaves the check ``inconclusive``)
    and ``reconstructible`` ([round, client] updates that can be rebuilt from what the store
    keeps: a fail).
    """
    title = "stored data deleted"
    d = ev.deletion
    if d is None:
        return Check(
            "deletion",
            title,
            "n/a",
            scope="store",
            reason="the run's history store was not read",
            aspect="store",
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
    for key in (
        "scan",
        "page_scan",
        "reconstructible",
    ):  # optional, richer evidence a store may add (see deletion_evidence)
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
            aspect="store",
        )
    rebuilt = list(d.get("reconstructible") or [])
    if rebuilt:
        shown = ", ".join(f"round {r} client {c}" for r, c in rebuilt[:3])
        return Check(
            "deletion",
            title,
            "fail",
            float(held_total),
            reference,
            reason=(
                f"{len(rebuilt)} deleted update(s) can be rebuilt from what the store keeps "
                f"({shown}): the deletion is not a deletion"
            ),
            scope="store",
            evidence=evidence,
            aspect="store",
        )
    page_scan = d.get("page_scan")
    if isinstance(page_scan, Mapping) and int(page_scan.get("fragments_found") or 0) > 0:
        return Check(
            "deletion",
            title,
            "fail",
            float(held_total),
            reference,
            reason=(
                f"the page scan found {int(page_scan['fragments_found']):,} fragment(s) of "
                "deleted payloads in the store's files"
            ),
            scope="store",
            evidence=evidence,
            aspect="store",
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
            aspect="store",
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
                aspect="store",
            )
        evidence["failure"] = "held"
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
            aspect="store",
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
    if isinstance(page_scan, Mapping) and not page_scan.get("ran", False):
        why = page_scan.get("inconclusive_reason") or "it did not run"
        return Check(
            "deletion",
            title,
            "inconclusive",
            0.0,
            reference,
            reason=f"{reason}; but the page scan of the store's files did not run ({why})",
            scope="store",
            evidence=evidence,
            aspect="store",
        )
    return Check(
        "deletion",
        title,
        "pass",
        0.0,
        reference,
        reason=reason,
        scope="store",
        evidence=evidence,
        aspect="store",
    )


# --- 9. the method's own warnings --------------------------------------------------------------


def check_method_warnings(ev: Evidence, th: VerificationThresholds) -> Check:
    """Check 9: the method raised no warning about its own result."""
    title = "method warnings"
    if not ev.warnings_available:
        return Check(
            "method_warnings",
            title,
            "n/a",
            reason="none were available (audit --result R.json carries the method's warnings)",
            aspect="method",
        )
    if not ev.warnings:
        return Check("method_warnings", title, "pass", 0.0, reason="none", aspect="method")
    return Check(
        "method_warnings",
        title,
        th.method_warning,
        float(len(ev.warnings)),
        reason="; ".join(s.rstrip(".") for s in ev.warnings),
        evidence={"warnings": list(ev.warnings)},
        aspect="method",
    )


_CHECKS = (
    check_backdoor,
    check_membership,
    check_client_membership,
    check_markers,
    check_poisoning,
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
    lineage = evidence.lineage.to_dict() if evidence.lineage is not None else None
    return Verification(
        checks, references, th.model_dump(mode="json"), subject, lineage, evidence.assumptions
    )
