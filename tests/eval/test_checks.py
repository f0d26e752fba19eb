"""The receipt's rules on hand-made rows: each verdict, its reason, the thresholds."""

import json

import pytest

from fedunlearn.errors import ConfigError
from fedunlearn.eval import Evidence, VerificationThresholds, build_verification
from fedunlearn.eval.checks import auc_standard_error
from fedunlearn.unlearn import BoundReport, Check, Verification

ORIGINAL = {
    "test_accuracy": 0.92,
    "backdoor_asr": 0.80,
    "backdoor_asr_forgotten": 0.85,
    "mia_auc": 0.60,
    "mia_loss_auc": 0.62,
    "distance_to_original": 0.0,
    "distance_to_retrain": 1.6,
}
RETRAIN = {
    "test_accuracy": 0.92,
    "backdoor_asr": 0.01,
    "backdoor_asr_forgotten": 0.02,
    "mia_auc": 0.50,
    "mia_loss_auc": 0.51,
    "distance_to_original": 1.6,
    "distance_to_retrain": 0.0,
}


def evidence(row, *, retrain=True, **kw):
    base = dict(
        row=row,
        original=ORIGINAL,
        retrain=RETRAIN if retrain else None,
        retrain_gap=1.6 if retrain else None,
        request_kind="recover",
        backdoor=True,
        attackers_forgotten=2,
        attackers_total=2,
    )
    base.update(kw)
    return Evidence(**base)


def verdicts(verification: Verification) -> dict[str, str]:
    return {c.name: c.verdict for c in verification.checks}


def test_retrain_passes_every_check_against_itself():
    v = build_verification(evidence(RETRAIN))
    assert verdicts(v) == {
        "backdoor": "pass",
        "membership": "pass",
        "distance": "pass",
        "bound": "n/a",
        "utility": "pass",
        "deletion": "n/a",
        "method_warnings": "pass",
    }
    assert v.verdict == "pass"
    assert v.reasons == ()
    assert v.references == ("original", "retrain")


def test_a_model_that_still_carries_the_backdoor_fails_check_1():
    row = {**RETRAIN, "backdoor_asr": 0.55, "distance_to_original": 0.5, "distance_to_retrain": 1.5}
    v = build_verification(evidence(row), subject="crab")
    check = v.check("backdoor")
    assert check.verdict == "fail"
    assert check.value == 0.55
    assert check.reference["retrain"] == 0.01
    assert check.reference["original"] == 0.80
    assert "the backdoor survives: ASR 55.0%" in check.reason
    assert v.verdict == "fail"
    assert (v.reasons[0].startswith(
        "backdoor removed: the backdoor survives"
    ))
    # without a Retrain reference the assumed clean-model ASR is the reference: still a failure
    alone = build_verification(evidence(row, retrain=False)).check("backdoor")
    assert alone.verdict == "fail"
    assert alone.reference["clean_assumed"] == 0.05


def test_backdoor_grades_and_when_it_does_not_apply():
    th = VerificationThresholds(backdoor_warn=0.05, backdoor_fail=0.10)
    grade = {
        asr: build_verification(evidence({**RETRAIN, "backdoor_asr": asr}), th)
        .check("backdoor")
        .verdict
        for asr in (0.05, 0.08, 0.2)
    }
    assert grade == {0.05: "pass", 0.08: "warn", 0.2: "fail"}
    not_applicable = [
        evidence(RETRAIN, backdoor=False),
        evidence(RETRAIN, attackers_forgotten=0),
        # another attacker stays: only Retrain says which ASR to expect
        evidence(RETRAIN, retrain=False, attackers_forgotten=1),
        # the original never carried the backdoor
        evidence(RETRAIN, original={**ORIGINAL, "backdoor_asr": 0.02}),
    ]
    reasons = [build_verification(e).check("backdoor") for e in not_applicable]
    assert [c.verdict for c in reasons] == ["n/a"] * 4
    assert "no backdoor attack" in reasons[0].reason
    assert "--reference retrain" in reasons[2].reason


def test_membership_is_judged_per_attack_against_retrain_or_chance():
    th = VerificationThresholds()
    row = {**RETRAIN, "mia_auc": 0.52, "mia_loss_auc": 0.585}
    check = build_verification(evidence(row), th).check("membership")
    assert check.value == 0.585
    assert check.verdict == "warn"  # 0.075 above Retrain's 0.51
    assert check.evidence["decided_by"] == "loss"
    assert "AUC 0.585 against 0.510 for Retrain" in check.reason
    alone = build_verification(evidence(row, retrain=False), th).check("membership")
    assert alone.reference["chance"] == 0.5
    assert alone.verdict == "warn"
    high = build_verification(evidence({**row, "mia_loss_auc": 0.7}), th).check("membership")
    assert high.verdict == "fail"
    none = build_verification(evidence({**row, "mia_auc": None, "mia_loss_auc": None}))
    assert none.check("membership").verdict == "n/a"


def test_membership_margin_must_exceed_the_sampling_noise():
    # 0.075 above Retrain: a trace on 5000 samples, noise on 60 (SE of an AUC there ~0.05)
    row = {**RETRAIN, "mia_auc": 0.52, "mia_loss_auc": 0.585}
    many = {**row, "mia_samples": [5000, 5000], "mia_loss_samples": [5000, 5000]}
    few = {**row, "mia_samples": [60, 60], "mia_loss_samples": [60, 60]}
    assert build_verification(evidence(many)).check("membership").verdict == "warn"
    check = build_verification(evidence(few)).check("membership")
    assert check.verdict == "pass"
    assert check.evidence["loss_standard_error"] > 0.05
    assert auc_standard_error(60, 60) == pytest.approx(0.0529, abs=1e-4)


def test_distance_fails_the_original_passes_closer_models_and_warns_far_ones():
    original = build_verification(evidence(ORIGINAL)).check("distance")
    assert original.verdict == "fail"
    assert "still the original model" in original.reason
    closer = {**RETRAIN, "distance_to_retrain": 0.4, "distance_to_original": 1.5}
    assert build_verification(evidence(closer)).check("distance").verdict == "pass"
    elsewhere = {**RETRAIN, "distance_to_retrain": 2.4, "distance_to_original": 2.5}
    far = build_verification(evidence(elsewhere)).check("distance")
    assert far.verdict == "warn"
    assert far.value == pytest.approx(1.5)
    # without Retrain: n/a, except that an unchanged model is caught
    assert build_verification(evidence(closer, retrain=False)).check("distance").verdict == "n/a"
    same = build_verification(evidence(ORIGINAL, retrain=False)).check("distance")
    assert same.verdict == "fail"
    assert "unchanged" in same.reason


def test_bound_check_reads_the_methods_certified_bound():
    row = {**RETRAIN, "distance_to_retrain": 0.3, "distance_to_original": 1.4}
    held = BoundReport("Theorem 1", bound=0.5, observed=0.2, reference="retrain from M_j")
    broken = BoundReport("Theorem 1", bound=0.1, observed=0.2, reference="retrain from M_j")
    measured_here = BoundReport("Theorem 1", bound=0.25)  # observed: distance to Retrain
    assert build_verification(evidence(row, bound=held)).check("bound").verdict == "pass"
    fail = build_verification(evidence(row, bound=broken)).check("bound")
    assert fail.verdict == "fail"
    assert "exceeds the certified 0.1" in fail.reason
    here = build_verification(evidence(row, bound=measured_here)).check("bound")
    assert here.verdict == "fail"
    assert here.value == 0.3
    no_ref = build_verification(evidence(row, retrain=False, bound=measured_here))
    assert no_ref.check("bound").verdict == "n/a"


def test_utility_drop_against_retrain_or_the_original():
    th = VerificationThresholds(utility_warn=0.02, utility_fail=0.05)
    grade = {
        acc: build_verification(evidence({**RETRAIN, "test_accuracy": acc}), th)
        .check("utility")
        .verdict
        for acc in (0.91, 0.89, 0.85)
    }
    assert grade == {0.91: "pass", 0.89: "warn", 0.85: "fail"}
    low = build_verification(evidence({**RETRAIN, "test_accuracy": 0.85}), th).check("utility")
    assert "7.0 points below Retrain (92.0%)" in low.reason


def test_deletion_check_reads_the_store_evidence():
    held = {
        "bytes_held": {"3": 4000},
        "payloads_held": 4,
        "records": [],
        "read_back": {"attempted": 0, "refused": 0, "readable": []},
    }
    forget = build_verification(evidence(RETRAIN, request_kind="forget", deletion=held))
    check = forget.check("deletion")
    assert check.verdict == "warn"
    assert check.scope == "store"
    assert "4,000 bytes" in check.reason
    assert "fedunlearn forget RUN --clients 3" in check.reason
    assert forget.verdict == "warn"
    assert forget.model_verdict == "pass"
    strict = VerificationThresholds(deletion_on_forget="fail")
    assert (
        build_verification(evidence(RETRAIN, request_kind="forget", deletion=held), strict)
        .check("deletion")
        .verdict
        == "fail"
    )
    assert build_verification(evidence(RETRAIN, deletion=held)).check("deletion").verdict == "n/a"
    deleted = {
        "bytes_held": {"3": 0},
        "payloads_held": 0,
        "records": [{"client_id": 3, "forgotten_at": 0.0, "size_bytes": 4000, "num_payloads": 4}],
        "read_back": {"attempted": 4, "refused": 4, "readable": []},
    }
    ok = build_verification(evidence(RETRAIN, request_kind="forget", deletion=deleted))
    assert ok.check("deletion").verdict == "pass"
    assert "4 payload(s), 4,000 bytes" in ok.check("deletion").reason
    leaky = {**deleted, "read_back": {"attempted": 4, "refused": 3, "readable": [[2, 3]]}}
    bad = build_verification(evidence(RETRAIN, request_kind="forget", deletion=leaky))
    assert bad.check("deletion").verdict == "fail"
    assert "round 2 client 3" in bad.reasons[0]


def test_method_warnings_become_a_warning_with_their_sentences():
    v = build_verification(evidence(RETRAIN, warnings=("rollback kept round 3 of client 1.",)))
    check = v.check("method_warnings")
    assert check.verdict == "warn"
    assert check.reason == "rollback kept round 3 of client 1"
    strict = VerificationThresholds(method_warning="fail")
    assert build_verification(evidence(RETRAIN, warnings=("x",)), strict).verdict == "fail"


def test_receipt_is_json_without_nan_and_failures_come_first():
    row = {**RETRAIN, "backdoor_asr": 0.5, "test_accuracy": 0.895, "mia_auc": float("nan")}
    v = build_verification(evidence(row), subject="m")
    block = v.to_dict()
    text = json.dumps(block, allow_nan=False)
    assert json.loads(text)["verdict"] == "fail"
    assert [r.split(":")[0] for r in block["reasons"]] == ["backdoor removed", "utility"]
    assert {c["name"] for c in block["checks"]} == {
        "backdoor",
        "membership",
        "distance",
        "bound",
        "utility",
        "deletion",
        "method_warnings",
    }
    assert block["thresholds"]["backdoor_fail"] == 0.10


def test_thresholds_are_validated():
    with pytest.raises(ValueError, match="backdoor_warn .* must not exceed backdoor_fail"):
        VerificationThresholds(backdoor_warn=0.2, backdoor_fail=0.1)
    with pytest.raises(ValueError, match="mia_warn_z .* must not exceed mia_fail_z"):
        VerificationThresholds(mia_warn_z=5)
    with pytest.raises(ValueError, match="Extra inputs"):
        VerificationThresholds(backdor_fail=0.1)
    with pytest.raises(ValueError):
        VerificationThresholds(utility_fail=2)
    with pytest.raises(ConfigError, match="verdict must be one of"):
        Check("x", "x", "ok")
