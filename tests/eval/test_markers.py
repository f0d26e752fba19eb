"""The markers check: a client's participation marker as evidence of its influence (issue 21).

Rules on hand-made rates, then the digits quickstart with a marker on client 0: the marker rate
is high on the original and at the clean baseline on Retrain; the receipt says ``remains`` for
the original plus noise and ``removed`` for Retrain's parameters audited without a lineage.
"""

from pathlib import Path

import pytest
import torch
from tests.support.evidence import flat_evidence

from fedunlearn.config import load_config
from fedunlearn.eval import Verifier
from fedunlearn.eval.markers import MarkerEvidence
from fedunlearn.eval.receipt import VerificationThresholds as Th
from fedunlearn.eval.receipt import build_verification, run_rule
from fedunlearn.eval.receipt.rules import markers as markers_rule
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "digits_quickstart.yaml"
ROW = {"test_accuracy": 0.9}


def check_markers(ev, th):
    return run_rule(markers_rule.RULE, ev, th)


def evidence(candidate, original=0.6, retrain=0.05, noisy=0.6, decoy=0.04):
    rates = {"candidate": {0: candidate}, "original": {0: original}, "original + noise": {0: noisy}}
    if retrain is not None:
        rates["retrain"] = {0: retrain}
    markers = MarkerEvidence(
        rates=rates,
        decoy_rates={k: {0: decoy} for k in rates},
        probes={0: 400},
        targets={0: 3},
    )
    return flat_evidence(ROW, original=ROW, markers=markers)


def test_a_model_at_retrains_marker_rate_passes_when_the_original_is_flagged():
    check = check_markers(evidence(0.06), Th())
    assert check.verdict == "pass"
    assert check.power["original_flagged"] is True
    v = build_verification(evidence(0.06))
    assert (v.influence, v.influence_basis) == ("not_detected", "powered_pass")


def test_a_model_whose_marker_still_works_fails():
    check = check_markers(evidence(0.5), Th())
    assert check.verdict == "fail"
    assert check.codes == ("survives",)


def test_no_power_when_the_original_does_not_carry_the_marker():
    check = check_markers(evidence(0.06, original=0.09, noisy=0.09), Th())
    assert check.verdict == "inconclusive"
    assert check.codes == ("no_power",)


def test_the_noise_allowance_grows_with_the_reference_rate():
    # 0.12 over a 0.5 base is within 3 binomial SE on 400 probes x 2 (sqrt(2 .25/400)=0.035)
    check = check_markers(evidence(0.62, original=0.95, noisy=0.95, retrain=0.5), Th())
    assert check.verdict == "warn"


def test_without_retrain_the_reference_is_the_models_decoy_rate():
    check = check_markers(evidence(0.05, retrain=None), Th())
    assert check.verdict == "pass"
    assert check.reference["retrain"] is None
    assert check.evidence["per_client"][0]["reference"] == 0.04  # the decoys' rate


def test_without_retrain_only_a_model_that_keeps_the_originals_rate_is_flagged():
    # a clean model's rate for the pattern may exceed the decoys' (measured 28% against 7%)
    clean_like = check_markers(
        evidence(0.28, original=0.72, noisy=0.72, retrain=None, decoy=0.07), Th()
    )
    assert clean_like.verdict == "warn"
    kept = check_markers(evidence(0.7, original=0.72, noisy=0.72, retrain=None, decoy=0.07), Th())
    assert kept.verdict == "fail"


def test_without_markers_the_check_is_na_and_hints_at_them():
    v = build_verification(flat_evidence(ROW, original=ROW))
    assert v.check("markers").verdict == "n/a"
    assert "markers" in v.hints


@pytest.mark.slow
def test_markers_flag_the_original_and_not_retrain_on_the_quickstart(tmp_path):
    torch.set_num_threads(1)
    config = load_config(QUICKSTART, {"verification": {"markers": {"clients": [0], "samples": 20}}})
    train_run(config, tmp_path / "run")
    with UnlearnSession(tmp_path / "run", evaluate=False) as session:
        request = UnlearnRequest.of([0], "forget")
        retrain = session.run(make_method("retrain"), request)
        verifier = Verifier(session, request, retrain=retrain)
        original = session.run_view.final_params
        rates = verifier.marker_probe.rates
        (marked_o, decoy_o), (marked_r, _) = rates(original), rates(retrain.params)
        assert marked_o[0] > marked_r[0] + 0.15  # high on the original, low on Retrain
        assert marked_o[0] > decoy_o[0] + 0.15  # far above never-embedded patterns
        g = torch.Generator().manual_seed(3)
        noisy = verifier.audit(original + 1e-3 * torch.randn(original.shape, generator=g))[1]
        assert noisy.check("markers").verdict == "fail"
        assert noisy.influence == "remains"
        clean = verifier.audit(retrain.params, "retrain params")[1]  # no lineage: checks only
        assert clean.check("markers").verdict == "pass"
        # no lineage: removed only by construction; the markers (power) flag nothing
        assert (clean.influence, clean.influence_basis) == ("not_detected", "powered_pass")
        assert clean.detection_limit is not None
        assert clean.detection_limit["lambda"] is not None
        assert "participation markers" in clean.detection_limit["by"]


def test_a_less_trained_model_faces_the_clean_less_trained_models_on_the_markers():
    # an under-trained clean CNN hits a marker's target more often than Retrain does; a model
    # less trained than the client-level test's references is compared with Retrain's earlier
    # global models as well, or a flag on it is only a warning
    import dataclasses

    from fedunlearn.eval.mia.client import ClientMembershipEvidence

    less = ClientMembershipEvidence(
        scores={"candidate": 0.0, "original": 5.0, "retrain": 0.1},
        threshold=2.0,
        target_fpr=0.05,
        power=1.0,
        num_reference_models=8,
        cost_seconds=1.0,
        cost_client_epochs=1.0,
        fitness={"candidate": 0.3, "original": 1.4, "retrain": 1.8},
        domain=(1.3, 1.9),
        in_max=6.0,
    )
    plain = evidence(0.3)
    assert check_markers(plain, Th()).verdict == "fail"  # against Retrain's 5%
    unmatched = dataclasses.replace(plain, client_membership=less)
    check = check_markers(unmatched, Th())
    assert check.verdict == "warn"
    assert check.codes == ("partly", "less_trained_unmeasured")
    path = dataclasses.replace(
        plain.markers,
        rates={**plain.markers.rates, "clean_round_3": {0: 0.28}},
        decoy_rates={**plain.markers.decoy_rates, "clean_round_3": {0: 0.04}},
    )
    matched = dataclasses.replace(unmatched, markers=path)
    check = check_markers(matched, Th())
    assert check.verdict == "warn"  # not flagged, not cleared: a pass needs Retrain's rate
    assert check.reference["clean_path"] == {"clean_round_3": {0: 0.28}}
    assert check.codes == ("partly", "less_trained_demoted")
    kept = dataclasses.replace(
        matched, markers=dataclasses.replace(path, rates={**path.rates, "candidate": {0: 0.6}})
    )
    assert check_markers(kept, Th()).verdict == "fail"
