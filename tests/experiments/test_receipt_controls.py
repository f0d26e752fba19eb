"""No pass without power, on the digits quickstart as shipped (issue 21).

The receipts of the original model plus small Gaussian noise (std 0, 1e-6, 1e-3) must never say
the influence is ``removed``: for an honest client (client 0), for one of the two backdoor
attackers, and for recovery from label flipping (the quickstart with ``attack.kind:
label_flip``). Retrain is ``removed`` by construction (its lineage is exact), and a model
no check with power flags is ``not_detected``, never ``removed``; the ``none`` control is never
``removed``.
"""

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fedunlearn.config import load_config
from fedunlearn.eval import Verifier, client_membership_check
from fedunlearn.eval.references import continued_controls
from fedunlearn.fl.client import local_update
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

pytestmark = pytest.mark.slow

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "digits_quickstart.yaml"
NOISE = (0.0, 1e-6, 1e-3)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def receipts_of(run: Path, forget: list[int], kind: str) -> dict:
    """Return the receipts of the noisy originals, Retrain and ``none``, with and without
    a Retrain reference."""
    out: dict = {}
    with UnlearnSession(run) as session:
        request = UnlearnRequest.of(forget, kind)
        retrain = session.run(make_method("retrain"), request)
        none = session.run(make_method("none"), request)
        final = session.run_view.final_params
        g = torch.Generator().manual_seed(11)
        noisy = {std: final + torch.randn(final.shape, generator=g) * std for std in NOISE}
        continued = continued_controls(session, request, retrain)[0]
        with_retrain = Verifier(session, request, retrain=retrain, continued_models=continued)
        alone = Verifier(session, request, judge=with_retrain.judge)
        for label, verifier in (("retrain_ref", with_retrain), ("original_ref", alone)):
            out[label] = {
                "noisy": {std: verifier.audit(p, f"noise {std}")[1] for std, p in noisy.items()},
                "retrain": verifier.verify(retrain).verification,
                "none": verifier.verify(none).verification,
            }
        out["retrain_lineage"] = retrain.lineage
    return out


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    run = tmp_path_factory.mktemp("quickstart") / "run"
    train_run(load_config(QUICKSTART), run)
    return run


@pytest.fixture(scope="module")
def label_flip(tmp_path_factory):
    run = tmp_path_factory.mktemp("label_flip") / "run"
    train_run(load_config(QUICKSTART, {"attack.kind": "label_flip"}), run)
    return run


def assert_never_removed(receipts: dict) -> None:
    for ref in ("retrain_ref", "original_ref"):
        for std, receipt in receipts[ref]["noisy"].items():
            assert receipt.influence in ("remains", "not_shown"), (ref, std, receipt.checks)
        assert receipts[ref]["none"].influence in ("remains", "not_shown")


def assert_retrain_removed_by_construction_or_not_flagged(receipts: dict, powered: bool) -> None:
    lineage = receipts["retrain_lineage"]
    receipt = receipts["retrain_ref"]["retrain"]
    if lineage is not None and lineage.exact:
        assert (receipt.influence, receipt.influence_basis) == ("removed", "exact_lineage")
    elif powered:  # a check with power flags nothing: not detected, never removed
        assert receipt.influence == "not_detected", receipt.influence_reason
    else:
        assert receipt.influence == "not_shown", receipt.influence_reason


def test_an_honest_clients_noisy_original_is_never_removed(quickstart):
    receipts = receipts_of(quickstart, [0], "forget")
    assert_never_removed(receipts)
    # both membership attacks sit within a few standard errors on the original and on
    # Retrain: the check is inconclusive, never a pass
    for receipt in receipts["retrain_ref"]["noisy"].values():
        membership = receipt.check("membership")
        assert membership.verdict == "inconclusive"
        assert membership.codes == ("no_power",)
        assert membership.power["shadow"]["original_flagged"] is False
    # with Retrain, a model within 1e-6 of the original is caught by the distance check
    assert receipts["retrain_ref"]["noisy"][1e-6].influence == "remains"
    assert_retrain_removed_by_construction_or_not_flagged(receipts, powered=False)


def test_one_of_two_attackers_noisy_original_remains_against_retrain(quickstart):
    receipts = receipts_of(quickstart, [1], "recover")
    assert_never_removed(receipts)
    for std, receipt in receipts["retrain_ref"]["noisy"].items():
        backdoor = receipt.check("backdoor")
        assert backdoor.verdict == "fail", (std, backdoor.reason)
        assert receipt.influence == "remains"
    for receipt in receipts["original_ref"]["noisy"].values():
        # another attacker stays: without Retrain the check cannot say (it was a silent n/a)
        assert receipt.check("backdoor").verdict == "inconclusive"
    assert_retrain_removed_by_construction_or_not_flagged(receipts, powered=True)


def test_label_flip_recovery_is_judged_against_retrain(label_flip):
    with UnlearnSession(label_flip) as session:
        attackers = sorted(session.run_view.malicious)
    receipts = receipts_of(label_flip, attackers, "recover")
    assert_never_removed(receipts)
    for receipt in receipts["retrain_ref"]["noisy"].values():
        poisoning = receipt.check("poisoning")
        # the poisoned original is 3.1 points below Retrain here (89.1% / 92.2%), under the
        # 5-point flag line: the check says it cannot tell, never pass
        assert poisoning.verdict in ("fail", "inconclusive"), poisoning.reason
        assert poisoning.reference["retrain"] > poisoning.reference["original"]
        assert receipt.check("utility").reference["retrain"] is not None
    for receipt in receipts["original_ref"]["noisy"].values():
        # never judged against the poisoned original (it used to pass against it)
        assert receipt.check("utility").verdict == "n/a"
        assert receipt.check("poisoning").verdict == "inconclusive"
    retrain = receipts["retrain_ref"]["retrain"]
    powered = retrain.check("poisoning").power["original_flagged"]
    assert_retrain_removed_by_construction_or_not_flagged(receipts, powered=powered)


def test_the_client_level_test_catches_a_model_fine_tuned_on_an_honest_client(quickstart):
    # Prepare: the receipt as `unlearn` builds it by default (client_test=True), forgetting
    # honest client 0; candidates: the original + 1e-3 noise (which the AUC attacks and the
    # distance cannot judge), Retrain fine-tuned on client 0 alone, and Retrain itself
    request = UnlearnRequest.of([0], "forget")
    with UnlearnSession(quickstart) as session:
        retrain = session.run(make_method("retrain"), request)
        federation = session.federation
        final = session.run_view.final_params
        noisy = final + torch.randn(final.shape, generator=torch.Generator().manual_seed(3)) * 1e-3
        tuned = local_update(
            federation.model,
            retrain.params,
            federation.client_data[0],
            replace(federation.spec, epochs=20),
            seed=1,
        )
        membership = client_membership_check(session, request, retrain)
        for with_retrain in (retrain, None):
            verifier = Verifier(
                session, request, retrain=with_retrain, client_membership=membership
            )

            # Execute
            _, noisy_receipt = verifier.audit(noisy, "original + 1e-3")
            _, tuned_receipt = verifier.audit(retrain.params + tuned.delta, "fine-tuned")
            retrain_receipt = verifier.verify(retrain).verification

            # Assert: a model fine-tuned on client 0 scores above every clean control (Retrain
            # continued 5 rounds scores above the original here, so the noisy original is not
            # flagged: the check says it cannot tell, never pass); Retrain is removed
            tuned_check = tuned_receipt.check("client_membership")
            assert tuned_check.verdict == "fail", tuned_check.reason
            assert tuned_receipt.influence == "remains", tuned_receipt.influence_reason
            noisy_check = noisy_receipt.check("client_membership")
            assert noisy_check.verdict in ("fail", "inconclusive"), noisy_check.reason
            assert noisy_receipt.influence in ("remains", "not_shown")
            assert retrain_receipt.check("client_membership").verdict in ("pass", "inconclusive")
            assert retrain_receipt.influence == "removed", retrain_receipt.influence_reason


def test_a_less_trained_clean_model_is_not_flagged_for_the_attackers(quickstart):
    # Prepare: recovering from the two attackers (1, 3 on seed 0), the client-level test's
    # "with" models are the *less* confident ones on the attackers' true labels, so a clean
    # model trained less scores like them: Retrain stopped after 20 of 30 rounds scores above
    # the calibrated line and was flagged (influence "remains": the demo's false alarms for
    # Crab, FedADP, random rounds and Starfish). It is less trained than every reference
    # model, so the test's calibration does not cover it: not cleared (warn), never fail
    from fedunlearn.eval.mia.client_lira import (
        _Budget,
        _run_participants,
        _SaltedClients,
        _train_reference,
    )

    request = UnlearnRequest.of([1, 3], "recover")
    with UnlearnSession(quickstart) as session:
        retrain = session.run(make_method("retrain"), request)
        rounds = _run_participants(session)
        shorter, _ = _train_reference(
            _SaltedClients(session.federation, 7),
            session.run_view.initial_params,
            rounds[:20],
            session.context(request).aggregator,
            frozenset(request.forget),
            _Budget(float("inf")),
        )
        membership = client_membership_check(session, request, retrain)
        verifier = Verifier(session, request, retrain=retrain, client_membership=membership)

        tuned = retrain.params.clone()
        for cid in request.forget:  # fine-tuned on the attackers: less fit on the others
            tuned = (
                tuned
                + local_update(
                    session.federation.model,
                    tuned,
                    session.federation.client_data[cid],
                    replace(session.federation.spec, epochs=20),
                    seed=cid,
                ).delta
            )

        # Execute
        _, receipt = verifier.audit(shorter.to(torch.float32), "Retrain, 20 of 30 rounds")
        _, original = verifier.audit(session.run_view.final_params, "original")
        _, tuned_receipt = verifier.audit(tuned, "fine-tuned on the attackers")

        # Assert: the clean model is not flagged (it is off the references' fitness range),
        # the original still is (the test keeps power)
        check = receipt.check("client_membership")
        assert check.value > check.threshold["calibrated"]  # the case the range is for
        assert check.evidence["region"] == "below"
        assert check.verdict == "warn", check.reason  # not cleared, never flagged
        assert check.codes == ("off_range_warn",)
        assert receipt.influence == "not_shown", receipt.influence_reason
        assert original.check("client_membership").verdict == "fail"
        assert original.check("client_membership").evidence["region"] == "within"
        # ... and a model fine-tuned on the attackers, less trained than every reference too,
        # is flagged beyond every clean, less trained model (Retrain's earlier rounds)
        check = tuned_receipt.check("client_membership")
        assert check.evidence["region"] == "below"
        assert len(check.evidence["clean_path"]) == 6  # after rounds 1, 5, 10, 15, 20, 25 of 30
        assert check.verdict == "fail", check.reason
        assert check.value > max(check.evidence["clean_path"].values())
        assert tuned_receipt.check("backdoor").verdict == "fail"
        assert tuned_receipt.influence == "remains", tuned_receipt.influence_reason
