"""Verdicts that are promises (issue 33): removed only by construction, not_detected with a limit.

Each false verdict of the issue's adversarial review is a case here, on hand-made evidence
shaped like what the review measured (the quickstart versions are in
tests/experiments/test_receipt_review_cases.py).
"""

import dataclasses
import math

import pytest
from tests.support.evidence import flat_evidence

from fedunlearn.eval import build_verification
from fedunlearn.eval.mia.client import GROUND_LIMIT, ClientMembershipEvidence
from fedunlearn.eval.receipt.intervals import auc_interval, mean_interval, wilson
from fedunlearn.unlearn.lineage import Lineage
from fedunlearn.unlearn.receipt import INFLUENCE_VERDICTS, limit_words

ORIGINAL = {
    "test_accuracy": 0.92,
    "backdoor_asr": 0.80,
    "distance_to_original": 0.0,
    "distance_to_retrain": 1.6,
    "toward_original": 1.0,
}
RETRAIN = {
    "test_accuracy": 0.92,
    "backdoor_asr": 0.01,
    "distance_to_original": 1.6,
    "distance_to_retrain": 0.0,
    "toward_original": 0.0,
}


def mixture(lam):
    """The weights ``Retrain + lam (original - Retrain)``: what the review audited."""
    return {
        "test_accuracy": 0.92,
        "backdoor_asr": 0.01,  # the backdoor is gone at small lam, the rest of the offset not
        "distance_to_original": 1.6 * (1 - lam),
        "distance_to_retrain": 1.6 * lam,
        "toward_original": lam,
    }


def client_test(candidate, **extra):
    scores = {"candidate": candidate, "original": 5.0, "retrain": 0.1}
    return ClientMembershipEvidence(
        scores=scores,
        threshold=2.0,
        target_fpr=0.05,
        power=1.0,
        num_reference_models=8,
        cost_seconds=1.0,
        cost_client_epochs=10.0,
        **extra,
    )


def honest(row, **kw):
    base = dict(
        original=ORIGINAL,
        retrain=RETRAIN,
        retrain_gap=1.6,
        request_kind="forget",
        clients=(0,),
        backdoor=True,
        attackers_forgotten=0,
        clients_forgotten=1,
        attackers_total=2,
    )
    return flat_evidence(row, **(base | kw))


def attackers(row, **kw):
    base = dict(
        original=ORIGINAL,
        retrain=RETRAIN,
        retrain_gap=1.6,
        request_kind="recover",
        clients=(1, 3),
        backdoor=True,
        attackers_forgotten=2,
        clients_forgotten=2,
        attackers_total=2,
    )
    return flat_evidence(row, **(base | kw))


@pytest.mark.parametrize("lam", [0.15, 0.25])
@pytest.mark.parametrize("case", [honest, attackers])
def test_a_weight_mixture_is_never_removed(case, lam):
    """Review: 0.25 o + 0.75 r and r + 0.15 (o - r) were `removed` (client test below its line,
    the backdoor gone, no distance check without Retrain)."""
    for retrain in (True, False):
        kw = {} if retrain else {"retrain": None, "retrain_gap": None, "clean_asr": 0.0}
        v = build_verification(case(mixture(lam), client_membership=client_test(0.5), **kw))
        assert v.influence != "removed"
        assert v.influence in ("not_detected", "not_shown")
    # only an exact lineage says removed
    exact = Lineage("exact", "initial model M_0", 0, 1, {}, "read no update of client 0")
    v = build_verification(case(mixture(lam), client_membership=client_test(0.5), lineage=exact))
    assert (v.influence, v.influence_basis) == ("removed", "exact_lineage")


def test_every_checks_pass_without_a_lineage_is_not_detected_never_removed():
    v = build_verification(attackers(RETRAIN, client_membership=client_test(0.5)))
    assert all(c.verdict in ("pass", "n/a") for c in v.checks)
    assert (v.influence, v.influence_basis) == ("not_detected", "powered_pass")
    assert set(INFLUENCE_VERDICTS) == {"removed", "not_detected", "not_shown", "remains"}


def test_a_retrain_from_another_initial_model_is_not_flagged_by_the_client_test():
    """Review: a Retrain from another M_0 was `remains` (every reference starts from M_0)."""
    # it scores above the line, as the review measured, but lies far from every reference
    far = client_test(4.0, ground={"candidate": 1.9, "original": 0.2, "retrain": 0.1})
    v = build_verification(honest(RETRAIN, client_membership=far))
    check = v.check("client_membership")
    assert far.region("candidate") == "elsewhere"
    assert (check.verdict, check.codes) == ("inconclusive", ("off_ground",))
    assert v.influence != "remains"
    # a contaminated model of this run's start (ground 0.22 measured for a fine-tuned one)
    near = client_test(4.0, ground={"candidate": 0.22, "original": 0.2, "retrain": 0.1})
    assert build_verification(honest(RETRAIN, client_membership=near)).influence == "remains"
    assert 0.22 < GROUND_LIMIT < 1.9


def test_not_detected_states_its_detection_limit():
    limit = {"lambda": 0.3, "by": ["client-level membership"], "not_flagged_at": 0.2}
    words = limit_words(limit | {"clean": "Retrain"})
    assert "0.30" in words
    assert "0.20" in words
    v = dataclasses.replace(
        build_verification(attackers(RETRAIN, client_membership=client_test(0.5))),
        detection_limit=limit,
    )
    assert v.to_dict()["detection_limit"]["lambda"] == 0.3
    assert "not measured" in limit_words(None)


def test_intervals_carry_their_sample_sizes():
    asr = wilson(0.5, 400)
    assert asr["n"] == 400
    assert asr["low"] == pytest.approx(0.451, abs=1e-3)
    assert asr["high"] == pytest.approx(0.549, abs=1e-3)
    edge = wilson(0.0, 50)
    assert edge["low"] == pytest.approx(0.0, abs=1e-12)
    assert 0.0 < edge["high"] < 0.08
    auc = auc_interval(0.5, [135, 225])
    assert auc["n"] == [135, 225]
    assert auc["high"] - 0.5 == pytest.approx(1.96 * 0.0316, abs=2e-3)  # Hanley-McNeil at 0.5
    assert mean_interval(1.0, 0.1, 300)["low"] == pytest.approx(1.0 - 0.196, abs=1e-3)
    assert wilson(None, 10) is None
    assert auc_interval(math.nan, [3, 3]) is None
    row = {**RETRAIN, "backdoor_samples": 400, "test_samples": 900}
    v = build_verification(attackers(row))
    assert v.check("backdoor").evidence["interval"]["n"] == 400
    assert v.check("utility").evidence["interval"]["n"] == 900


def test_a_client_test_without_calibration_says_so():
    """Out of time (a loaded machine) or skipped: no power, and the receipt names why."""
    cut = dataclasses.replace(
        client_test(math.nan), power=None, notes={"inconclusive": "only 1 'in' reference"}
    )
    check = build_verification(honest(RETRAIN, client_membership=cut)).check("client_membership")
    assert (check.verdict, check.codes) == ("inconclusive", ("not_calibrated",))
    assert check.evidence["cost_client_epochs"] == 10.0
