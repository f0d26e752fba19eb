"""The receipt's rules on hand-made rows: each verdict, its reason, the thresholds, the controls."""

import dataclasses
import json
import math

import pytest
from tests.support.evidence import flat_evidence

from fedunlearn.errors import ConfigError
from fedunlearn.eval import VerificationThresholds, build_verification
from fedunlearn.eval.mia.client import ClientMembershipEvidence
from fedunlearn.eval.receipt import run_rule
from fedunlearn.eval.receipt.rules import markers as markers_rule
from fedunlearn.eval.receipt.rules.membership import auc_standard_error
from fedunlearn.unlearn import BoundReport, Check, Verification
from fedunlearn.unlearn.lineage import Lineage

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


def check_markers(ev, th):
    return run_rule(markers_rule.RULE, ev, th)


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
    return flat_evidence(**base)


def verdicts(verification: Verification) -> dict[str, str]:
    return {c.name: c.verdict for c in verification.checks}


def test_retrain_passes_every_check_against_itself():
    v = build_verification(evidence(RETRAIN))
    assert verdicts(v) == {
        "backdoor": "pass",
        "membership": "pass",
        "client_membership": "n/a",
        "markers": "n/a",
        "poisoning": "n/a",
        "distance": "pass",
        "bound": "n/a",
        "utility": "pass",
        "deletion": "n/a",
        "method_warnings": "pass",
    }
    assert v.verdict == "pass"
    assert v.reasons == ()
    assert v.references == ("original", "retrain")
    # no check with power flags it: not detected (removed only by an exact lineage)
    assert v.influence == "not_detected"
    assert v.influence_basis == "powered_pass"
    assert (v.utility, v.store) == ("ok", "unknown")


def test_a_model_that_still_carries_the_backdoor_fails_check_1():
    row = {**RETRAIN, "backdoor_asr": 0.55, "distance_to_original": 0.5, "distance_to_retrain": 1.5}
    v = build_verification(evidence(row), subject="crab")
    check = v.check("backdoor")
    assert check.verdict == "fail"
    assert check.value == 0.55
    assert check.reference["retrain"] == 0.01
    assert check.reference["original"] == 0.80
    assert check.codes == ("survives",)
    assert v.verdict == "fail"
    assert v.reasons[0].startswith("backdoor removed:")  # failures first
    assert v.influence == "remains"
    # without a Retrain reference the clean ASR measured on M_0 is the reference: still a failure
    alone = build_verification(evidence(row, retrain=False, clean_asr=0.03)).check("backdoor")
    assert alone.verdict == "fail"
    assert alone.reference["clean_measured"] == 0.03
    # nothing measured: nothing assumed
    unknown = build_verification(evidence(row, retrain=False)).check("backdoor")
    assert unknown.verdict == "inconclusive"


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
    ]
    reasons = [build_verification(e).check("backdoor") for e in not_applicable]
    assert [c.verdict for c in reasons] == ["n/a"] * 2
    assert [c.codes for c in reasons] == [("no_backdoor",), ("no_attacker_forgotten",)]
    cannot_tell = [
        # another attacker stays: only Retrain says which ASR to expect (was a silent n/a)
        evidence(RETRAIN, retrain=False, attackers_forgotten=1, clean_asr=0.0),
        # the original never carried the backdoor: the test has no power
        evidence(RETRAIN, original={**ORIGINAL, "backdoor_asr": 0.02}),
    ]
    reasons = [build_verification(e).check("backdoor") for e in cannot_tell]
    assert [c.verdict for c in reasons] == ["inconclusive"] * 2
    assert [c.codes for c in reasons] == [("others_remain",), ("no_power",)]
    assert reasons[1].power["original_flagged"] is False


def test_membership_is_judged_per_attack_against_retrain_or_chance():
    th = VerificationThresholds()
    row = {**RETRAIN, "mia_auc": 0.52, "mia_loss_auc": 0.585}
    check = build_verification(evidence(row), th).check("membership")
    assert check.value == 0.585
    assert check.verdict == "warn"  # 0.075 above Retrain's 0.51
    assert check.evidence["decided_by"] == "loss"
    assert check.codes == ("partly",)
    assert check.reference["retrain"] == 0.51
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
    # on 60 samples the original (0.11 above Retrain, ~2 SE) is not flagged either: no power,
    # so the check cannot pass (it used to)
    assert check.verdict == "inconclusive"
    assert check.evidence["loss_standard_error"] > 0.05
    assert check.power["loss"]["original_flagged"] is False
    assert check.power["loss"]["separation_se"] == pytest.approx(0.11 / 0.0529, rel=1e-2)
    assert auc_standard_error(60, 60) == pytest.approx(0.0529, abs=1e-4)


def test_distance_fails_the_original_passes_only_close_models():
    original = build_verification(evidence(ORIGINAL)).check("distance")
    assert original.verdict == "fail"
    assert original.codes == ("still_original",)
    closer = {**RETRAIN, "distance_to_retrain": 0.4, "distance_to_original": 1.5}
    assert build_verification(evidence(closer)).check("distance").verdict == "pass"
    elsewhere = {**RETRAIN, "distance_to_retrain": 2.4, "distance_to_original": 2.9}
    far = build_verification(evidence(elsewhere)).check("distance")
    assert far.verdict == "inconclusive"
    assert far.value == pytest.approx(1.5)
    # the original plus noise moved "away" and used to pass up to 1.25x; now it fails
    noisy = {**ORIGINAL, "distance_to_retrain": 1.61, "distance_to_original": 0.1}
    assert build_verification(evidence(noisy)).check("distance").verdict == "fail"
    # between the pass line and the original: inconclusive, and never decisive on its own
    mid = {**RETRAIN, "distance_to_retrain": 1.2, "distance_to_original": 1.8}
    check = build_verification(evidence(mid)).check("distance")
    assert check.verdict == "inconclusive"
    assert check.decisive is False
    # without Retrain: n/a, except that an unchanged model is caught
    assert build_verification(evidence(closer, retrain=False)).check("distance").verdict == "n/a"
    same = build_verification(evidence(ORIGINAL, retrain=False)).check("distance")
    assert same.verdict == "fail"
    assert same.codes == ("unchanged",)


def test_the_distance_band_from_measured_retrains_sets_the_pass_line_and_needs_power():
    from fedunlearn.eval.distance_band import DistanceBand

    noisy = {**ORIGINAL, "distance_to_retrain": 1.64, "distance_to_original": 0.3}
    tight = DistanceBand((0.53, 0.68, 0.62), cost_seconds=1.0, cost_client_epochs=3.0)
    assert 0.68 < tight.band < 1.0
    # 0.6x: inside the band of exact retrains, the original (1.0x) and the noisy one outside
    inside = {**RETRAIN, "distance_to_retrain": 0.96, "distance_to_original": 1.6}
    check = build_verification(
        evidence(inside, noisy_original=noisy, noise_std=1e-3, distance_band=tight)
    ).check("distance")
    assert check.verdict == "pass"
    assert check.threshold["pass"] == pytest.approx(tight.band)
    assert check.power["original"]["outside_band"] is True
    assert check.codes == ("pass",)
    assert check.evidence["band"]["count"] == 3
    # 0.9x, beyond the band: inconclusive
    beyond = {**RETRAIN, "distance_to_retrain": 1.44, "distance_to_original": 2.0}
    assert (
        build_verification(evidence(beyond, distance_band=tight)).check("distance").verdict
        == "inconclusive"
    )
    # retrains as far from Retrain as the original: no power, a close model is inconclusive
    wide = DistanceBand((0.6, 0.98, 0.9), cost_seconds=1.0, cost_client_epochs=3.0)
    assert wide.band > 1.0
    no_power = build_verification(evidence(inside, distance_band=wide)).check("distance")
    assert no_power.verdict == "inconclusive"
    assert no_power.codes == ("no_power",)
    # the unchanged original still fails whatever the band
    assert (
        build_verification(evidence(ORIGINAL, distance_band=wide)).check("distance").verdict
        == "fail"
    )


def test_bound_is_checked_on_the_returned_model_and_only_when_non_vacuous():
    row = {**RETRAIN, "distance_to_retrain": 0.3, "distance_to_original": 1.4}
    held = BoundReport("Theorem 1", bound=0.5)
    broken = BoundReport("Theorem 1", bound=0.25)
    kw = {"initial_gap": 2.0}
    ok = build_verification(evidence(row, bound=held, **kw)).check("bound")
    assert (ok.verdict, ok.value, ok.aspect) == ("pass", 0.3, "method")
    fail = build_verification(evidence(row, bound=broken, **kw)).check("bound")
    assert fail.verdict == "fail"
    assert fail.codes == ("broken",)
    assert fail.reference["bound"] == 0.25
    # a bound larger than ||M_0 - Retrain|| says nothing (Crab's 16.04 against 6.79)
    vacuous = BoundReport("Theorem 1", bound=16.04)
    check = build_verification(evidence(row, bound=vacuous, initial_gap=6.79)).check("bound")
    assert check.verdict == "n/a"
    assert check.codes == ("vacuous",)
    # the method's own observation, on another model (before final tuning): not the result's
    other = BoundReport("Theorem 1", bound=0.5, observed=0.2, reference="retrain from M_j")
    assert build_verification(evidence(row, bound=other, **kw)).check("bound").verdict == "n/a"
    no_ref = build_verification(evidence(row, retrain=False, bound=held))
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
    assert low.codes == ("drop",)
    assert low.reference["retrain"] == 0.92
    assert low.threshold["fail"] == pytest.approx(0.87)


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
    assert check.codes == ("held",)
    assert check.value == 4000
    assert forget.verdict == "warn"
    assert forget.model_verdict == "pass"
    strict = VerificationThresholds(deletion_on_forget="fail")
    assert (
        build_verification(evidence(RETRAIN, request_kind="forget", deletion=held), strict)
        .check("deletion")
        .verdict
        == "fail"
    )
    recover = build_verification(evidence(RETRAIN, deletion=held))
    assert recover.check("deletion").verdict == "n/a"
    assert recover.store == "held"
    deleted = {
        "bytes_held": {"3": 0},
        "payloads_held": 0,
        "records": [{"client_id": 3, "forgotten_at": 0.0, "size_bytes": 4000, "num_payloads": 4}],
        "read_back": {"attempted": 4, "refused": 4, "readable": []},
    }
    ok = build_verification(evidence(RETRAIN, request_kind="forget", deletion=deleted))
    assert ok.check("deletion").verdict == "pass"
    assert ok.check("deletion").codes == ("deleted",)
    leaky = {**deleted, "read_back": {"attempted": 4, "refused": 3, "readable": [[2, 3]]}}
    bad = build_verification(evidence(RETRAIN, request_kind="forget", deletion=leaky))
    assert bad.check("deletion").verdict == "fail"
    assert bad.check("deletion").codes == ("readable",)
    assert bad.check("deletion").evidence["read_back"]["readable"] == [[2, 3]]
    assert (ok.store, forget.store, bad.store) == ("deleted", "held", "damaged")


def test_deletion_reads_the_page_scan_and_rebuildable_updates():
    deleted = {
        "clients": [3],
        "bytes_held": {"3": 0},
        "payloads_held": 0,
        "records": [],
        "read_back": {"attempted": 4, "refused": 4, "readable": []},
    }
    clean_scan = {"ran": True, "fragments_found": 0, "inconclusive_reason": None}

    def store_check(**extra):
        e = evidence(RETRAIN, request_kind="forget", deletion={**deleted, **extra})
        return build_verification(e)

    assert store_check(page_scan=clean_scan, reconstructible=[]).check("deletion").verdict == (
        "pass"
    )
    found = store_check(page_scan={**clean_scan, "fragments_found": 4170})
    assert found.check("deletion").verdict == "fail"
    assert found.check("deletion").codes == ("fragments",)
    assert found.check("deletion").evidence["page_scan"]["fragments_found"] == 4170
    assert found.store == "damaged"
    rebuilt = store_check(page_scan=clean_scan, reconstructible=[[1, 3], [2, 3]])
    assert rebuilt.check("deletion").verdict == "fail"
    assert rebuilt.check("deletion").codes == ("rebuildable",)
    skipped = store_check(
        page_scan={"ran": False, "fragments_found": 0, "inconclusive_reason": "no page size"}
    )
    assert skipped.check("deletion").verdict == "inconclusive"
    assert skipped.check("deletion").codes == ("never_held", "scan_not_run")


def test_method_warnings_become_a_warning_with_their_sentences():
    v = build_verification(evidence(RETRAIN, warnings=("rollback kept round 3 of client 1.",)))
    check = v.check("method_warnings")
    assert check.verdict == "warn"
    assert check.codes == ("warned",)
    assert check.evidence["warnings"] == ["rollback kept round 3 of client 1."]
    strict = VerificationThresholds(method_warning="fail")
    assert build_verification(evidence(RETRAIN, warnings=("x",)), strict).verdict == "fail"
    # checks that see nothing do not overrule a method that warns its result may keep the
    # influence (e.g. Crab's paper rollback): not shown, never removed
    warned = build_verification(evidence(RETRAIN, warnings=("x",)), strict)
    assert warned.influence == "not_shown"
    assert warned.influence_basis == "method_warns"
    unknown = build_verification(evidence(RETRAIN, warnings_available=False))
    assert unknown.check("method_warnings").verdict == "n/a"
    assert unknown.check("method_warnings").codes == ("unavailable",)


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
        "client_membership",
        "markers",
        "poisoning",
        "distance",
        "bound",
        "utility",
        "deletion",
        "method_warnings",
    }
    assert block["thresholds"]["backdoor_fail"] == 0.10
    assert block["influence"] == "remains"
    assert block["lineage"] is None


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


# --- no pass without power: the controls -------------------------------------------------------

# the digits quickstart, forgetting honest client 0 (issue 21): both attacks under one standard
# error apart on the original and on Retrain, 135 members against 225 non-members
QS_ORIGINAL = {
    **ORIGINAL,
    "mia_auc": 0.547,
    "mia_loss_auc": 0.512,
    "mia_samples": [135, 225],
    "mia_loss_samples": [68, 113],
}
QS_RETRAIN = {**RETRAIN, "mia_auc": 0.533, "mia_loss_auc": 0.495}


def honest(row, *, retrain=True, **kw):
    base = dict(
        original=QS_ORIGINAL,
        request_kind="forget",
        backdoor=True,
        attackers_forgotten=0,
        attackers_total=2,
        noisy_original={**QS_ORIGINAL, "distance_to_original": 0.09, "distance_to_retrain": 1.61},
        noise_std=1e-3,
        clean_asr=0.0,
    )
    base.update(kw)
    if retrain:
        base.update(retrain=QS_RETRAIN, retrain_gap=1.6)
    return flat_evidence(row, **base)


def noisy(std):
    """The quickstart original plus noise of ``std``: the same AUCs, moved a little."""
    moved = std * 95  # sqrt(9,000 parameters)
    return {**QS_ORIGINAL, "distance_to_original": moved, "distance_to_retrain": 1.6 + moved / 10}


@pytest.mark.parametrize("std", [0.0, 1e-6, 1e-3])
@pytest.mark.parametrize("retrain", [True, False])
def test_the_original_plus_noise_is_never_removed_for_an_honest_client(std, retrain):
    v = build_verification(honest(noisy(std), retrain=retrain))
    membership = v.check("membership")
    assert membership.verdict == "inconclusive"  # it used to pass
    assert membership.codes == ("no_power",)
    # under 1 SE from Retrain, 1.5 from chance: far below the 4 SE a flag needs
    assert membership.power["shadow"]["separation_se"] < (1 if retrain else 2)
    assert v.influence != "removed"
    if retrain or std == 0:  # the distance check catches a model that stayed at the original
        assert v.influence == "remains"
        assert v.check("distance").codes in (("still_original",), ("unchanged",))
    else:
        assert (v.influence, v.influence_basis) == ("not_shown", "no_power")
        assert v.hints == ["retrain_reference", "client_test", "markers"]


def test_retrain_of_an_honest_client_is_not_shown_clean_by_powerless_checks():
    # until a check with power exists (client-level test, markers) or the lineage is exact
    v = build_verification(honest(QS_RETRAIN))
    assert v.influence == "not_shown"
    exact = Lineage("exact", "initial model M_0", 0, 1, {}, "read no update of client 0")
    v = build_verification(honest(QS_RETRAIN, lineage=exact))
    assert (v.influence, v.influence_basis) == ("removed", "exact_lineage")
    assert v.to_dict()["lineage"]["kind"] == "exact"
    # an approximate lineage shows nothing by itself
    approx = Lineage("approximate", "final model M_T", 30, 1, {"models": [30]}, "read M_T")
    assert build_verification(honest(QS_RETRAIN, lineage=approx)).influence == "not_shown"


def client_test(candidate, *, original=5.0, retrain=0.1, threshold=2.0):
    return ClientMembershipEvidence(
        scores={"candidate": candidate, "original": original, "retrain": retrain},
        threshold=threshold,
        target_fpr=0.05,
        power=0.9,
        num_reference_models=8,
        cost_seconds=3.0,
        cost_client_epochs=100.0,
    )


def test_client_membership_needs_its_controls():
    removed = build_verification(honest(QS_RETRAIN, client_membership=client_test(0.5)))
    check = removed.check("client_membership")
    assert check.verdict == "pass"
    assert check.power["original_flagged"] is True
    assert removed.influence == "not_detected"
    remains = build_verification(honest(noisy(1e-3), client_membership=client_test(4.8)))
    assert remains.check("client_membership").verdict == "fail"
    assert remains.influence == "remains"
    blind = build_verification(honest(QS_RETRAIN, client_membership=client_test(0.5, original=1.0)))
    assert blind.check("client_membership").verdict == "inconclusive"
    assert blind.influence == "not_shown"
    # a clean control above the calibrated threshold raises the flag line: a clean model off
    # Retrain's path (Retrain trained 5 rounds more scored above the original for honest
    # client 0 on the quickstart) must never make a candidate 'remains'
    raised = client_test(2.5, retrain=0.1)
    raised.scores["retrain_continued"] = 3.0
    off_path = build_verification(honest(QS_RETRAIN, client_membership=raised))
    check = off_path.check("client_membership")
    assert check.verdict == "pass"
    assert check.threshold["fail"] == 3.0
    assert check.power["clean_controls_above_threshold"] == ["retrain_continued"]
    blinded = client_test(2.5, original=2.8)
    blinded.scores["retrain_continued"] = 3.0
    both = build_verification(honest(QS_RETRAIN, client_membership=blinded))
    assert both.check("client_membership").verdict == "inconclusive"
    assert both.influence == "not_shown"
    tuned = client_test(40.0, original=2.8)
    tuned.scores["retrain_continued"] = 3.0
    caught = build_verification(honest(QS_RETRAIN, client_membership=tuned))
    assert caught.check("client_membership").verdict == "fail"
    assert caught.influence == "remains"


# one of two attackers forgotten: the backdoored original + noise (ASR 81.5% against Retrain's
# 43.8%) used to pass through a silent n/a
PARTIAL_ORIGINAL = {**QS_ORIGINAL, "backdoor_asr": 0.815}
PARTIAL_RETRAIN = {**QS_RETRAIN, "backdoor_asr": 0.438}


# Retrain continued 1, 2, 5 rounds by the remaining clients: the attacker that stays keeps
# training its backdoor (ASR grows with the rounds)
PARTIAL_MORE = {
    f"retrain_continued_{k}": {"backdoor_asr": asr} for k, asr in ((1, 0.47), (2, 0.50), (5, 0.58))
}


def partial(row, *, retrain=True, clean_more=PARTIAL_MORE):
    return flat_evidence(
        row=row,
        original=PARTIAL_ORIGINAL,
        retrain=PARTIAL_RETRAIN if retrain else None,
        retrain_gap=1.6 if retrain else None,
        request_kind="recover",
        backdoor=True,
        attackers_forgotten=1,
        attackers_total=2,
        clean_asr=0.0,
        clean_more=clean_more,
    )


def test_forgetting_one_of_two_attackers_is_judged_against_retrain_or_inconclusive():
    noisy_original = {**PARTIAL_ORIGINAL, "distance_to_original": 0.09, "distance_to_retrain": 1.61}
    with_retrain = build_verification(partial(noisy_original))
    check = with_retrain.check("backdoor")
    assert check.verdict == "fail"
    assert check.codes == ("survives", "others_grow_beyond")
    assert check.threshold["fail"] == pytest.approx(0.58 + 0.10)  # beyond Retrain + 5 rounds
    assert with_retrain.influence == "remains"
    alone = build_verification(partial(noisy_original, retrain=False))
    assert alone.check("backdoor").verdict == "inconclusive"
    assert alone.influence == "not_shown"
    retrain = build_verification(partial(PARTIAL_RETRAIN))
    assert retrain.check("backdoor").verdict == "pass"
    assert retrain.influence == "not_detected"


def test_retrain_trained_more_while_other_attackers_remain_is_never_remains():
    """Issue 33: Retrain + 5 rounds with the other attacker present was flagged `remains`.

    The attacker that stays trains its backdoor every round; the receipt's clean controls
    trained more than Retrain (Retrain continued 1-5 rounds) raise the fail line to theirs.
    """
    more5 = {**PARTIAL_RETRAIN, "backdoor_asr": 0.58, "distance_to_retrain": 0.5}
    v = build_verification(partial(more5))
    assert v.check("backdoor").verdict == "warn"  # above Retrain's 43.8%: not cleared either
    assert v.check("backdoor").codes == ("partly", "others_grow_demoted")
    assert v.influence != "remains"
    # without the continued controls no flag on such a request can be trusted: a warning
    blind = build_verification(partial(more5, clean_more={}))
    assert blind.check("backdoor").codes == ("partly", "others_grow_unmeasured")
    assert blind.influence != "remains"
    # every attacker forgotten: nobody keeps training a backdoor; Retrain's level holds
    alone = dataclasses.replace(
        partial(more5), attack=dataclasses.replace(partial(more5).attack, attackers_total=1)
    )
    assert build_verification(alone).check("backdoor").verdict == "fail"


# label-flip recovery: the poisoned original is 6.9 points below Retrain
FLIP_ORIGINAL = {**QS_ORIGINAL, "test_accuracy": 0.85, "backdoor_asr": None}
FLIP_RETRAIN = {**QS_RETRAIN, "test_accuracy": 0.919, "backdoor_asr": None}


def flip(row, *, retrain=True):
    return flat_evidence(
        row=row,
        original=FLIP_ORIGINAL,
        retrain=FLIP_RETRAIN if retrain else None,
        retrain_gap=1.6 if retrain else None,
        request_kind="recover",
        attackers_forgotten=2,
        attackers_total=2,
        attack_kind="label_flip",
    )


def test_label_flip_recovery_is_judged_against_retrain_never_the_poisoned_original():
    noisy_original = {**FLIP_ORIGINAL, "distance_to_original": 0.09, "distance_to_retrain": 1.61}
    v = build_verification(flip(noisy_original))
    assert v.check("poisoning").verdict == "fail"
    assert v.check("utility").verdict == "fail"  # against Retrain's 91.9%
    assert v.influence == "remains"
    alone = build_verification(flip(noisy_original, retrain=False))
    assert alone.check("utility").verdict == "n/a"  # it used to pass against the poisoned original
    assert alone.check("utility").codes == ("poisoned_original",)
    assert alone.check("poisoning").verdict == "inconclusive"
    assert alone.influence != "removed"
    recovered = build_verification(flip({**FLIP_RETRAIN, "test_accuracy": 0.915}))
    assert recovered.check("poisoning").verdict == "pass"
    assert recovered.influence == "not_detected"
    assert recovered.utility == "ok"


def test_utility_and_influence_are_separate_verdicts():
    # the backdoor is gone but accuracy dropped: influence removed, utility degraded
    row = {**RETRAIN, "test_accuracy": 0.80}
    v = build_verification(evidence(row))
    assert v.influence == "not_detected"
    assert v.utility == "degraded"
    assert v.check("utility").aspect == "utility"


def test_a_dp_run_says_that_retrain_is_not_private():
    # fresh client work in a session carries no DP noise: Retrain is a non-private reference
    v = build_verification(evidence({**RETRAIN, "test_accuracy": 0.90}, private_run=True))
    assert v.check("utility").codes[1:] == ("dp_noise_free",)
    plain = build_verification(evidence({**RETRAIN, "test_accuracy": 0.90}))
    assert plain.check("utility").codes == ("drop",)  # no DP note


def test_a_method_that_warns_its_result_keeps_the_influence_is_never_removed():
    # Crab's paper rollback may start from a model that contains the forgotten clients and
    # warns so; checks that see nothing must not overrule the method's own warning
    clean = honest(QS_RETRAIN, client_membership=client_test(0.5))
    assert build_verification(clean).influence == "not_detected"
    warned = honest(
        QS_RETRAIN,
        client_membership=client_test(0.5),
        warnings=("rollback_includes_forgotten: the rollback model contains client 0",),
    )
    verification = build_verification(warned)
    assert verification.check("method_warnings").verdict in ("warn", "fail")
    assert verification.influence == "not_shown"
    assert verification.influence_basis == "method_warns"


def test_a_backdoor_pass_does_not_show_removal_of_honest_clients_in_the_same_request():
    # forgetting one attacker and one honest client: a model at Retrain's ASR passes the
    # backdoor check, but that says nothing about the honest client (calibration, seed 2)
    mixed = build_verification(evidence(RETRAIN, clients_forgotten=3))
    check = mixed.check("backdoor")
    assert check.verdict == "pass"
    assert check.decisive is False
    assert "honest_not_covered" in check.codes
    assert build_verification(evidence(RETRAIN)).check("backdoor").decisive is True


def test_a_half_way_interpolation_that_passes_the_backdoor_check_is_not_removed():
    # The MNIST CNN calibration's one false `removed`: 0.5 original + 0.5 Retrain, recovering
    # from both attackers, with a backdoor ASR at Retrain's (a decisive pass) and a pass of the
    # client-level test. Its distances put it half-way along the line from Retrain to the
    # original (||u - r|| = ||u - o|| = gap / 2); the client-level test's references trained
    # without the attackers (exact retrains) lie at 0.01-0.03 on that line
    half = {**RETRAIN, "distance_to_retrain": 0.8, "distance_to_original": 0.8}
    cm = dataclasses.replace(client_test(0.5), reference_toward=(0.018, 0.031, 0.012, 0.02))
    v = build_verification(evidence(half, client_membership=cm))
    assert v.check("backdoor").verdict == "pass"
    assert v.check("client_membership").verdict == "pass"
    distance = v.check("distance")
    assert distance.verdict == "warn"
    assert distance.evidence["toward_original"] == pytest.approx(0.5)
    assert distance.threshold["toward"] < 0.06
    assert distance.codes == ("toward",)
    assert distance.evidence["toward_original"] == pytest.approx(0.5)
    assert v.influence == "not_shown"
    assert v.influence_basis == "check_warns"
    # the controls lie at the original's end of the line
    assert distance.power["original"]["toward_original"] == pytest.approx(1.0)
    # an exact retrain with another batch order: far from Retrain, but orthogonal to o - r
    other = {**RETRAIN, "distance_to_retrain": 0.2, "distance_to_original": 1.61}
    v = build_verification(evidence(other, client_membership=cm))
    assert v.check("distance").evidence["toward_original"] == pytest.approx(0.0015, abs=1e-3)
    assert v.check("distance").verdict == "pass"
    assert v.influence == "not_detected"
    # without measured retrains the fixed line (0.4: exact retrains stay below 0.5, and were
    # measured up to 0.31) warns at the half-way model too
    check = build_verification(evidence(half)).check("distance")
    assert check.verdict == "warn"
    assert check.threshold["toward"] == VerificationThresholds().distance_toward == 0.4
    assert check.evidence["toward_line"]["source"] == "fixed"
    # two references are too few for a measured line (the Student-t factor is 6.3): fixed line
    two = dataclasses.replace(client_test(0.5), reference_toward=(0.1, 0.5))
    check = build_verification(evidence(half, client_membership=two)).check("distance")
    assert check.verdict == "warn"
    assert check.threshold["toward"] == 0.4
    # a wide measured spread is capped at the fixed line
    wide = dataclasses.replace(client_test(0.5), reference_toward=(0.25, 0.32, 0.1))
    check = build_verification(evidence(half, client_membership=wide)).check("distance")
    assert check.threshold["toward"] == 0.4
    assert check.evidence["toward_line"]["bound"] > check.threshold["toward"] == 0.4
    assert check.verdict == "warn"
    # a position that cannot be computed (NaN) is never cleared
    nan = dataclasses.replace(client_test(0.5), reference_toward=(0.01, math.nan, 0.02))
    check = build_verification(evidence(half, client_membership=nan)).check("distance")
    assert check.verdict == "warn"
    odd = {**half, "toward_original": math.nan}
    assert build_verification(evidence(odd)).check("distance").verdict == "warn"
    # the judge's row carries the position computed from the parameters, which the check uses
    exact = {**half, "toward_original": 0.01}
    assert build_verification(evidence(exact)).check("distance").verdict != "warn"


def test_the_toward_line_comes_from_measured_exact_retrains():
    from fedunlearn.eval.distance_band import DistanceBand

    quarter = {**RETRAIN, "distance_to_retrain": 0.4, "distance_to_original": 1.2}  # at 0.25
    tight = DistanceBand(
        (0.11, 0.12, 0.11), cost_seconds=1.0, cost_client_epochs=3.0, toward=(0.004, 0.005, 0.006)
    )
    check = build_verification(evidence(quarter, distance_band=tight)).check("distance")
    assert check.verdict == "warn"
    assert check.threshold["toward"] == pytest.approx(tight.toward_line)
    assert tight.toward_line < 0.02
    assert check.evidence["toward_line"]["source"] == "band"
    # the client-level test's "without" references serve when no band was measured
    cm = dataclasses.replace(client_test(0.5), reference_toward=(0.01, 0.02, 0.015, 0.03))
    check = build_verification(evidence(quarter, client_membership=cm)).check("distance")
    assert check.verdict == "warn"
    assert check.evidence["toward_line"]["source"] == "client_test"
    # retrains that spread widely along o - r leave no warning for a quarter-way model
    wide = DistanceBand(
        (0.5, 0.6, 0.55), cost_seconds=1.0, cost_client_epochs=3.0, toward=(0.2, 0.35, 0.3)
    )
    check = build_verification(evidence(quarter, distance_band=wide)).check("distance")
    assert check.verdict != "warn"


def ranged(
    candidate, fitness, *, original=5.0, in_max=6.0, continued=None, cont_fit=1.4, path=None
):
    scores = {"candidate": candidate, "original": original, "retrain": 0.1}
    fit = {"candidate": fitness, "original": 1.38, "retrain": 1.86}
    if continued is not None:
        scores["retrain_continued"] = continued
        fit["retrain_continued"] = cont_fit
    for t, score in (path or {}).items():  # Retrain's earlier global models
        scores[f"clean_round_{t}"] = score
        fit[f"clean_round_{t}"] = 0.2 * t
    return dataclasses.replace(
        client_test(candidate, original=original),
        scores=scores,
        fitness=fit,
        domain=(1.3, 1.95),
        in_max=in_max,
    )


def test_the_client_level_test_judges_only_models_trained_like_its_references():
    # a clean model less trained than every reference scores like a "with" model on the
    # attackers' poisoned examples: it used to be flagged (the demo's false `remains`); above
    # the line it is not cleared either (warn: never `removed`)
    less = build_verification(evidence(RETRAIN, client_membership=ranged(3.5, 0.3)))
    check = less.check("client_membership")
    assert check.verdict == "warn"
    assert check.evidence["region"] == "below"
    assert check.threshold["fail"] == pytest.approx(6.0)  # the line applied: every "with" ref
    assert check.threshold["line"] == pytest.approx(2.0)
    assert check.codes == ("off_range_warn",)
    assert less.influence == "not_shown"
    # below the line: inconclusive, never pass
    low = build_verification(evidence(RETRAIN, client_membership=ranged(1.0, 0.3)))
    assert low.check("client_membership").verdict == "inconclusive"
    assert low.check("client_membership").codes == ("off_range",)
    # ... but a less trained model above every "with" reference and every clean, less trained
    # model (Retrain's earlier rounds) is: a model fine-tuned on the client
    tuned = build_verification(
        evidence(RETRAIN, client_membership=ranged(50.0, -3.0, path={1: 4.0, 3: 7.0}))
    )
    check = tuned.check("client_membership")
    assert check.verdict == "fail"
    assert check.codes == ("found_below",)
    assert check.evidence["clean_path"] == {"clean_round_1": 4.0, "clean_round_3": 7.0}
    assert check.threshold["fail"] == pytest.approx(7.0)
    assert tuned.influence == "remains"
    # a clean, less trained model scoring as high: the line rises to it
    matched = ranged(6.5, 0.3, path={1: 4.0, 3: 7.0})
    check = build_verification(evidence(RETRAIN, client_membership=matched)).check(
        "client_membership"
    )
    assert check.verdict == "warn"
    # without Retrain's earlier rounds nothing as little trained was measured: above every
    # "with" reference is not enough (Retrain at half the rounds scored there on the CNN)
    unmatched = build_verification(evidence(RETRAIN, client_membership=ranged(50.0, -3.0)))
    check = unmatched.check("client_membership")
    assert check.verdict == "warn"
    assert check.codes == ("less_trained_unmeasured",)
    assert unmatched.influence == "not_shown"
    # a model trained more than the references: inconclusive, never pass; flagged only above
    # every clean control, the one trained longer included
    more = build_verification(evidence(RETRAIN, client_membership=ranged(0.5, 2.5)))
    assert more.check("client_membership").verdict == "inconclusive"
    assert more.check("client_membership").codes == ("off_range",)
    assert more.check("client_membership").evidence["region"] == "above"
    longer = ranged(3.5, 2.5, continued=4.0, cont_fit=2.5)
    check = build_verification(evidence(RETRAIN, client_membership=longer)).check(
        "client_membership"
    )
    assert check.verdict == "inconclusive"
    # the threshold plus the clean score growth from Retrain (0.1) to the control (4.0)
    assert check.threshold["fail"] == pytest.approx(2.0 + 3.9)
    beyond = ranged(9.0, 2.5, continued=4.0, cont_fit=2.5)
    v = build_verification(evidence(RETRAIN, client_membership=beyond))
    assert v.check("client_membership").verdict == "fail"
    assert v.influence == "remains"
    # within the range: the calibrated rule
    within = build_verification(evidence(RETRAIN, client_membership=ranged(0.5, 1.5)))
    assert within.check("client_membership").verdict == "pass"
    # a clean control more fit than the model does not raise its line
    outside = ranged(3.0, 1.5, continued=4.0, cont_fit=2.5)
    check = build_verification(evidence(RETRAIN, client_membership=outside)).check(
        "client_membership"
    )
    assert check.threshold["fail"] == pytest.approx(2.0)
    assert check.verdict == "fail"
    # the original is judged at the line the model faces
    assert check.power["controls"]["original"] == "fail"
    # a model whose outputs are not finite is never cleared by this test
    nan = dataclasses.replace(
        ranged(0.5, 1.5), fitness={"candidate": math.nan, "original": 1.38, "retrain": 1.86}
    )
    check = build_verification(evidence(RETRAIN, client_membership=nan)).check("client_membership")
    assert check.verdict == "inconclusive"
    assert check.codes == ("invalid",)
    nan_score = ranged(math.nan, 1.5)
    check = build_verification(evidence(RETRAIN, client_membership=nan_score)).check(
        "client_membership"
    )
    assert check.verdict == "inconclusive"
    # an original outside the range leaves the test without power
    blind = dataclasses.replace(ranged(0.5, 1.5), fitness={"candidate": 1.5, "original": 0.2})
    check = build_verification(evidence(RETRAIN, client_membership=blind)).check(
        "client_membership"
    )
    assert check.verdict == "inconclusive"
    assert check.codes == ("no_power",)


def quickstart_controls(**changes):
    # the client-level evidence of the quickstart, honest client 0 (seed 0): Retrain and the
    # receipt's clean controls, Retrain continued 1..5 rounds, with their fitness
    scores = {"candidate": 1.6, "original": 0.97, "retrain": -0.91}
    fitness = {"candidate": 1.47, "original": 1.365, "retrain": 1.387}
    for k, (score, fit) in enumerate(
        [(-0.2, 1.42), (1.2, 1.47), (1.9, 1.55), (2.4, 1.66), (2.86, 1.76)], start=1
    ):
        scores[f"retrain_continued_{k}"] = score
        fitness[f"retrain_continued_{k}"] = fit
    scores.update(changes.pop("scores", {}))
    fitness.update(changes.pop("fitness", {}))
    return ClientMembershipEvidence(
        scores=scores,
        threshold=-0.31,
        target_fpr=0.05,
        power=1.0,
        num_reference_models=8,
        cost_seconds=3.0,
        cost_client_epochs=100.0,
        notes={"reference_scores": {"out": [-0.68, -1.24, -1.23, -0.9], "in": [1.2, 1.0, 0.8]}},
        fitness=fitness,
        domain=(1.26, 1.54),
        in_max=1.23,
        **changes,
    )


def client_check(cm):
    v = build_verification(honest(QS_RETRAIN, client_membership=cm))
    return v, v.check("client_membership")


def test_a_clean_model_trained_a_little_longer_is_judged_against_clean_controls_as_fit():
    # The quickstart calibration, seed 0, honest client 0: Retrain + 2 rounds (clean) lies
    # within the references' fitness range and scored above the calibrated threshold: it was
    # `remains`. The line at a model's fitness is the threshold plus what training that much
    # adds to a clean model's score (the controls' envelope, from Retrain's score)
    v, check = client_check(quickstart_controls())
    assert check.threshold["fail"] == pytest.approx(-0.31 + (1.2 + 0.91))
    assert v.influence != "remains"
    # ... and the original (0.97), below that line, cannot show the test's power there
    assert check.verdict == "inconclusive", check.reason
    assert check.power["controls"]["original"] == "pass"
    # a model as fit but far more confident on the client's data is flagged
    v, check = client_check(quickstart_controls(scores={"candidate": 11.3}))
    assert check.verdict == "fail"
    assert v.influence == "remains"
    # between two controls the growth is interpolated
    _, check = client_check(quickstart_controls(fitness={"candidate": 1.51}))
    assert check.threshold["fail"] == pytest.approx(-0.31 + (1.55 + 0.91))
    # a model less fit than Retrain (the original's case) faces the calibrated threshold, and
    # a contaminated model there is caught with the original as its control
    v, check = client_check(
        quickstart_controls(scores={"candidate": 0.9}, fitness={"candidate": 1.37})
    )
    assert check.threshold["fail"] == pytest.approx(-0.31)
    assert check.verdict == "fail"
    assert v.influence == "remains"
    # a contaminated model more fit than the original whose score the controls' line covers:
    # the original is not flagged at that line, so no pass (it used to pass, then `removed`)
    v, check = client_check(quickstart_controls(scores={"candidate": 1.5}))
    assert check.verdict == "inconclusive"
    assert v.influence != "removed"


def test_clean_models_at_the_edges_of_the_controls_are_not_flagged():
    # trained beyond the last control (Retrain + 7 rounds on the clean trend): the line follows
    # the last segment's growth, and off the references' range it is never a pass
    _, check = client_check(
        quickstart_controls(scores={"candidate": 3.73}, fitness={"candidate": 1.95})
    )
    assert check.threshold["fail"] == pytest.approx(-0.31 + (2.86 + 4.6 * 0.19 + 0.91), abs=1e-6)
    assert check.verdict == "inconclusive"
    # two controls at one fitness: the line uses the higher score (not the first segment's)
    tied = quickstart_controls(
        scores={"candidate": 1.2}, fitness={"retrain_continued_1": 1.47, "candidate": 1.47}
    )
    _, check = client_check(tied)
    assert check.threshold["fail"] == pytest.approx(-0.31 + (1.2 + 0.91))
    assert check.verdict != "fail"
    # a clean Retrain that scores above the threshold: the test flags clean models here, so a
    # flag is not cleared but not shown either (warn), and a pass is inconclusive
    noisy = quickstart_controls(
        scores={"retrain": 1.0, "candidate": 0.9}, fitness={"candidate": 1.38}
    )
    v, check = client_check(noisy)
    assert check.power["retrain_flagged"] is True
    assert check.verdict == "warn"
    assert check.codes == ("flags_retrain",)
    assert v.influence == "not_shown"


def test_a_less_trained_model_faces_the_clean_less_trained_models_on_the_backdoor():
    # Retrain stopped at half the rounds of the reduced MNIST CNN had a backdoor ASR far above
    # Retrain's (a clean, under-trained model sends the trigger to the target class on its own):
    # it was a false `remains`. A model less trained than every reference is compared with
    # Retrain's earlier global models as well
    less = ranged(-5.0, 0.3)  # fitness below the references' range, client test silent
    path = {"clean_round_2": {"backdoor_asr": 0.35}, "clean_round_5": {"backdoor_asr": 0.20}}
    half = {**RETRAIN, "backdoor_asr": 0.38}
    check = build_verification(evidence(half, client_membership=less, clean_path=path)).check(
        "backdoor"
    )
    # 3 points above the worst clean, less trained model: not flagged, and not cleared either
    # (a pass still needs Retrain's ASR)
    assert check.verdict == "warn"
    assert check.reference["clean_path"] == {"clean_round_2": 0.35, "clean_round_5": 0.20}
    assert check.threshold["fail"] == pytest.approx(0.35 + VerificationThresholds().backdoor_fail)
    assert check.codes == ("partly", "less_trained_demoted")
    near = {**RETRAIN, "backdoor_asr": 0.03}
    check = build_verification(evidence(near, client_membership=less, clean_path=path)).check(
        "backdoor"
    )
    assert check.verdict == "pass"
    # far above every clean model and near the original: still caught
    kept = {**RETRAIN, "backdoor_asr": 0.78}
    v = build_verification(evidence(kept, client_membership=less, clean_path=path))
    assert v.check("backdoor").verdict == "fail"
    assert v.influence == "remains"
    # a clean less-trained model as high as the original leaves the check without power
    blind = {"clean_round_1": {"backdoor_asr": 0.72}}
    beyond = {**RETRAIN, "backdoor_asr": 0.95}
    check = build_verification(evidence(beyond, client_membership=less, clean_path=blind)).check(
        "backdoor"
    )
    assert check.verdict == "fail"  # above every clean model: a flag stays a flag ...
    check = build_verification(evidence(half, client_membership=less, clean_path=blind)).check(
        "backdoor"
    )
    assert check.verdict == "warn"  # ... and below it, a warning
    # without Retrain's earlier rounds a flag on a less trained model is not `remains`
    v = build_verification(evidence(half, client_membership=less))
    assert v.check("backdoor").verdict == "warn"
    assert v.check("backdoor").codes == ("partly", "less_trained_unmeasured")
    assert v.influence == "not_shown"
    # a model trained like the references is judged against Retrain alone, as before
    within = ranged(-5.0, 1.5)
    v = build_verification(evidence(half, client_membership=within, clean_path=path))
    assert v.check("backdoor").verdict == "fail"
    assert "clean_path" not in v.check("backdoor").reference


# --- review of the clean-path rule: each case failed before its fix ---------------------------


def _markers(cand, original, extra=None):
    from fedunlearn.eval.markers import MarkerEvidence

    rates = {
        "candidate": cand,
        "original": original,
        "original + noise": original,
        "retrain": {c: 0.05 for c in cand},
        **(extra or {}),
    }
    return MarkerEvidence(
        rates=rates,
        decoy_rates={k: {c: 0.04 for c in cand} for k in rates},
        probes={c: 400 for c in cand},
        targets={c: 3 for c in cand},
    )


def _marker_ev(markers, cm):
    return flat_evidence(
        row=RETRAIN,
        original=ORIGINAL,
        retrain=RETRAIN,
        retrain_gap=1.6,
        request_kind="recover",
        markers=markers,
        client_membership=cm,
    )


def test_a_demoted_marker_flag_with_a_weak_original_is_a_warning_not_a_removal():
    # the flag was turned into a warning before the controls were applied, and a warning with
    # an unflagged original became `inconclusive`: the receipt said `removed`
    ev = _marker_ev(_markers({0: 0.5}, {0: 0.09}), ranged(0.0, 0.3))

    assert check_markers(ev, VerificationThresholds()).verdict == "warn"
    assert build_verification(ev).influence == "not_shown"


def test_the_marker_reason_names_the_flagged_client_and_its_own_clean_rates():

    th = VerificationThresholds()
    ev = _marker_ev(
        _markers({0: 0.70, 1: 0.50}, {0: 0.9, 1: 0.9}, {"clean_round_3": {0: 0.65, 1: 0.05}}),
        ranged(0.0, 0.3),
    )
    check = check_markers(ev, th)
    assert check.verdict == "fail"
    assert check.codes[0] == "survives"
    assert check.value == check.evidence["per_client"][1]["rate"]  # client 1 is named
    assert check.value == 0.50
    # the raised line is reported whatever the model's rate
    low, high = (
        check_markers(
            _marker_ev(_markers({0: r}, {0: 0.9}, {"clean_round_3": {0: 0.3}}), ranged(0.0, 0.3)),
            th,
        )
        for r in (0.12, 0.3)
    )
    assert low.threshold["fail"][0] == pytest.approx(high.threshold["fail"][0])
    # a warning quotes the demoted client's clean rate, not another client's
    ev = _marker_ev(
        _markers({0: 0.02, 1: 0.30}, {0: 0.9, 1: 0.9}, {"clean_round_3": {0: 0.80, 1: 0.28}}),
        ranged(0.0, 0.3),
    )
    check = check_markers(ev, th)
    assert check.verdict == "warn"
    assert check.codes == ("partly", "less_trained_demoted")
    assert check.value == pytest.approx(0.30)  # the demoted client 1 is the one named


def test_the_client_level_warning_never_promises_an_unreachable_line():
    ev = flat_evidence(
        row=RETRAIN, original=ORIGINAL, retrain=RETRAIN, client_membership=ranged(3.0, 0.3)
    )
    check = build_verification(ev).check("client_membership")
    assert check.verdict == "warn"
    assert check.codes == ("off_range_warn",)


def test_a_less_trained_clean_model_is_not_poisoned_for_its_lower_accuracy():
    flip_o = {**ORIGINAL, "test_accuracy": 0.85, "backdoor_asr": None}
    flip_r = {**RETRAIN, "test_accuracy": 0.92, "backdoor_asr": None}
    half = {**flip_r, "test_accuracy": 0.84}
    base = dict(
        row=half,
        original=flip_o,
        retrain=flip_r,
        retrain_gap=1.6,
        request_kind="recover",
        attackers_forgotten=1,
        attackers_total=1,
        attack_kind="label_flip",
    )
    assert build_verification(flat_evidence(**base)).check("poisoning").verdict == "fail"
    less = flat_evidence(
        **base,
        client_membership=ranged(0.0, 0.3),
        clean_path={"clean_round_5": {"test_accuracy": 0.84}},
    )
    v = build_verification(less)
    assert v.check("poisoning").verdict == "warn"
    assert v.check("poisoning").codes == ("partly", "less_trained_demoted")
    assert v.influence != "remains"
    # far below every clean, less trained model: still flagged
    worse = dataclasses.replace(less, row={**flip_r, "test_accuracy": 0.60})
    assert build_verification(worse).check("poisoning").verdict == "fail"


def test_a_backdoor_flag_on_a_less_trained_model_stays_when_no_clean_model_is_higher():
    retrain = {**RETRAIN, "backdoor_asr": 0.438}
    ev = flat_evidence(
        row={**retrain, "backdoor_asr": 0.538},
        original=ORIGINAL,
        retrain=retrain,
        retrain_gap=1.6,
        request_kind="recover",
        backdoor=True,
        attackers_forgotten=2,
        attackers_total=2,
        client_membership=ranged(0.0, 0.3),
        clean_path={"clean_round_1": {"backdoor_asr": 0.2}},
    )
    assert build_verification(ev).check("backdoor").verdict == "fail"
