"""The receipt on the digits quickstart (configs/digits_quickstart.yaml, trained as shipped).

What issue 14 asks the tests to show (with issue 21's verdicts): Retrain's influence is removed
(the backdoor check has power here) and no check flags it; a Crab result that keeps the
backdoor is flagged (Crab exactly as printed: ``rollback: paper``, the literal j* rule and no
final tuning, which leaves 55-70% ASR on this run); default Crab passes the backdoor check; an
audit of the original model fails.
"""

from pathlib import Path

import pytest

from fedunlearn.config import load_config
from fedunlearn.eval import Verifier
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "digits_quickstart.yaml"


def crab_keeping_the_backdoor() -> dict:
    """Crab's parameters that reproduce the paper's rollback, rule and replay as printed."""
    return {"rollback": "paper", "rule": "literal", "final_rounds": 0}


@pytest.fixture(scope="module")
def receipts(tmp_path_factory):
    run = tmp_path_factory.mktemp("quickstart") / "run"
    train_run(load_config(QUICKSTART), run)
    with UnlearnSession(run) as session:
        request = UnlearnRequest.of(sorted(session.run_view.malicious), "recover")
        retrain = session.run(make_method("retrain"), request)
        verifier = Verifier(session, request, retrain=retrain)
        crab = session.run(make_method("crab", crab_keeping_the_backdoor()), request)
        yield {
            "retrain": verifier.verify(retrain).verification,
            # what `fedunlearn unlearn --method retrain` reports without --reference retrain
            "retrain_alone": Verifier(session, request, judge=verifier.judge)
            .verify(retrain)
            .verification,
            "crab": verifier.verify(crab).verification,
            "crab_default": verifier.verify(session.run(make_method("crab"), request)).verification,
            "original": verifier.audit(session.run_view.final_params, "original")[1],
        }


@pytest.mark.slow
def test_retrain_passes_every_check(receipts):
    for key in ("retrain", "retrain_alone"):
        receipt = receipts[key]
        assert receipt.influence == "removed", receipt.influence_reason
        assert receipt.utility == "ok"
        # the membership attacks cannot tell the original from Retrain here: inconclusive
        assert {c.verdict for c in receipt.checks} <= {"pass", "n/a", "inconclusive"}
        assert receipt.check("backdoor").verdict == "pass"
        assert receipt.check("backdoor").power["original_flagged"] is True
        assert receipt.check("utility").verdict == "pass"
        assert receipt.check("membership").verdict == "inconclusive"
    assert receipts["retrain"].check("distance").verdict == "pass"


@pytest.mark.slow
def test_crab_that_keeps_the_backdoor_is_flagged(receipts):
    receipt = receipts["crab"]
    assert receipt.verdict == "fail"
    assert receipt.influence == "remains"
    backdoor = receipt.check("backdoor")
    assert backdoor.verdict == "fail"
    assert backdoor.value > 0.3
    assert receipt.reasons[0].startswith("backdoor removed: the backdoor survives")


@pytest.mark.slow
def test_default_crab_removes_the_backdoor(receipts):
    receipt = receipts["crab_default"]
    assert receipt.check("backdoor").verdict == "pass", receipt.reasons
    assert receipt.verdict != "fail", receipt.reasons


def test_an_audit_of_the_original_model_fails(receipts):
    receipt = receipts["original"]
    assert receipt.verdict == "fail"
    assert receipt.influence == "remains"
    assert receipt.check("backdoor").verdict == "fail"
    assert receipt.check("distance").verdict == "fail"
