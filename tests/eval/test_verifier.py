"""The Verifier on a small real run: receipts attached, hooks read, deletion evidence."""

import shutil
from dataclasses import dataclass

import pytest
import torch

from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError, ForgottenDataError
from fedunlearn.eval import Verifier, deletion_evidence, reference_retrain
from fedunlearn.eval.judge import Judge
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import train_run
from fedunlearn.unlearn import (
    BoundReport,
    Costs,
    Details,
    UnlearnRequest,
    UnlearnResult,
    UnlearnSession,
    make_method,
)

RUN = {
    "seed": 7,
    "data": {"dataset": "digits", "num_clients": 5},
    "model": {"name": "mlp", "hidden": [16]},
    "training": {"rounds": 3, "local_epochs": 1, "lr": 0.3, "batch_size": 32, "executor": "serial"},
    "history": {"policy": "all"},
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("verify") / "run"
    train_run(parse_config(RUN), out)
    return out


@dataclass(frozen=True)
class CertifiedDetails(Details):
    """A method's details with a bound and a warning (the two hooks the receipt reads)."""

    bound: float
    observed: float
    warnings: tuple[str, ...] = ()

    def certified_bound(self) -> BoundReport | None:
        return BoundReport("test bound", bound=self.bound, observed=self.observed)


def test_verify_attaches_the_receipt_and_changes_nothing_else(run_dir):
    request = UnlearnRequest.of([2])
    with UnlearnSession(run_dir) as session:
        result = session.run(make_method("federaser"), request)
        assert result.verification is None
        verifier = Verifier(session, request)
        verified = verifier.verify(result)
    assert torch.equal(verified.params, result.params)
    assert verified.costs == result.costs
    receipt = verified.verification
    assert receipt is not None
    assert receipt.subject == "federaser"
    assert receipt.references == ("original",)
    assert receipt.check("distance").verdict == "n/a"  # no Retrain reference asked for
    assert receipt.check("backdoor").verdict == "n/a"  # the run has no attack
    # a deletion request whose client's updates are still stored warns, naming the command
    assert receipt.check("deletion").verdict == "warn"
    assert receipt.check("deletion").codes == ("held",)


def test_the_bound_and_warnings_hooks_of_a_methods_details_are_read(run_dir):
    request = UnlearnRequest.of([2])
    with UnlearnSession(run_dir) as session:
        verifier = Verifier(session, request)
        final = session.run_view.final_params.clone()

        def result(details):
            return UnlearnResult("custom", final, Costs(), details=details)

        # without Retrain there is nothing to check a bound on
        alone = verifier.verify(result(CertifiedDetails(bound=1.0, observed=0.5)))
        retrain = reference_retrain(session, request, "retrain")
        verifier = Verifier(session, request, retrain=retrain, judge=verifier.judge)
        gap, initial = verifier.retrain_gap, verifier.initial_gap
        assert 0 < gap < initial
        # the bound is checked on the returned model's distance to Retrain (here the original's:
        # gap), not on the distance the method observed elsewhere (observed=0.0)
        holds = verifier.verify(result(CertifiedDetails(bound=(gap + initial) / 2, observed=0.0)))
        broken = verifier.verify(result(CertifiedDetails(gap / 2, 0.0, ("rollback kept round 2",))))
        vacuous = verifier.verify(result(CertifiedDetails(bound=initial * 2, observed=0.0)))
    assert alone.verification.check("bound").verdict == "n/a"
    assert holds.verification.check("bound").verdict == "pass"
    assert holds.verification.check("bound").value == pytest.approx(gap)
    assert broken.verification.check("bound").verdict == "fail"
    assert vacuous.verification.check("bound").verdict == "n/a"
    assert vacuous.verification.check("bound").codes == ("vacuous",)
    warning = broken.verification.check("method_warnings")
    assert warning.verdict == "warn"
    assert warning.evidence["warnings"] == ["rollback kept round 2"]


def test_a_methods_assumptions_reach_its_receipt_verbatim(run_dir):
    # issue 41: Starfish's threat model ("semi-honest servers: a server that alters its shares
    # is not detected") was in no result or receipt
    request = UnlearnRequest.of([2])
    with UnlearnSession(run_dir) as session:
        verifier = Verifier(session, request)
        starfish = verifier.verify(session.run(make_method("starfish"), request))
        final = session.run_view.final_params.clone()
        _, audited = verifier.audit(final, "m.pt", assumptions=["threat model: semi-honest"])
        plain = verifier.verify(session.run(make_method("federaser"), request))
    receipt = starfish.verification
    assert receipt.assumptions == starfish.details.assumptions
    assert receipt.assumptions[0].startswith("plaintext mirror: ")
    assert receipt.to_dict()["assumptions"] == list(starfish.details.assumptions)
    assert audited.to_dict()["assumptions"] == ["threat model: semi-honest"]
    assert plain.verification.assumptions == ()  # a method that states none


def test_audit_of_the_original_model_fails_and_bad_models_are_refused(run_dir):
    request = UnlearnRequest.of([1])
    with UnlearnSession(run_dir) as session:
        verifier = Verifier(session, request)
        row, receipt = verifier.audit(session.run_view.final_params, "original.pt")
        assert receipt.verdict == "fail"
        assert receipt.influence == "remains"
        assert receipt.lineage is None
        assert receipt.check("method_warnings").verdict == "n/a"
        assert receipt.subject == "original.pt"
        assert receipt.check("distance").codes == ("unchanged",)
        assert row["distance_to_original"] == 0.0
        with pytest.raises(ConfigError, match="this run's mlp has"):
            verifier.audit(torch.zeros(10), "tiny")
        with pytest.raises(ConfigError, match="reference must be one of original, retrain"):
            reference_retrain(session, request, "best")


def test_deletion_records_list_exactly_the_deleted_payloads_and_later_reads_fail(run_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    forgotten = 3
    with HistoryStore.open(run / "history", writable=True) as store:
        before = deletion_evidence(store, [forgotten])
        held_bytes = before["bytes_held"][forgotten]
        rounds = [r for r in store.rounds() if r and store.has_update(r, forgotten)]
        deleted = store.forget([forgotten])
    assert held_bytes > 0
    assert before["payloads_held"] == len(rounds) == 3
    assert before["records"] == []
    assert before["read_back"]["attempted"] == 0
    assert deleted.size_bytes == held_bytes
    assert deleted.client_ids == (forgotten,)
    with HistoryStore.open(run / "history") as store:
        after = deletion_evidence(store, [forgotten])
        for r in rounds:
            with pytest.raises(ForgottenDataError):
                store.read_update(r, forgotten)
        other = deletion_evidence(store, [0])
    assert after["bytes_held"] == {forgotten: 0}
    assert after["payloads_held"] == 0
    (record,) = after["records"]
    assert record["client_id"] == forgotten
    assert record["size_bytes"] == held_bytes
    assert record["num_payloads"] == len(rounds)
    assert after["read_back"] == {
        "attempted": len(rounds),
        "refused": len(rounds),
        "not_stored": 0,
        "readable": [],
    }
    assert other["records"] == []
    assert other["bytes_held"][0] > 0  # nobody else was touched
    request = UnlearnRequest.of([forgotten])
    with UnlearnSession(run) as session:
        verifier = Verifier(session, request)
        receipt = verifier.verify(session.run(make_method("retrain"), request)).verification
    check = receipt.check("deletion")
    assert check.verdict == "pass"
    assert check.codes == ("deleted",)
    assert check.evidence["read_back"]["refused"] == 3
    assert sum(r["size_bytes"] for r in check.evidence["records"]) == held_bytes


def test_a_shared_judge_keeps_no_retrain_reference_between_verifiers(run_dir):
    # Issue 20: the verifier set the judge's retrain reference in its constructor, so a later
    # verifier without Retrain sharing the judge still measured distances to that Retrain
    request = UnlearnRequest.of([2])
    with UnlearnSession(run_dir) as session:
        judge = Judge(session.run_view, session.evaluation, request)
        retrain = reference_retrain(session, request, "retrain")
        with_retrain = Verifier(session, request, retrain=retrain, judge=judge)
        alone = Verifier(session, request, judge=judge)
        final = session.run_view.final_params
        row_alone = alone.audit(final, "original")[0]
        row_with = with_retrain.audit(final, "original")[0]
        assert reference_retrain(session, request, "original") is None
    assert row_alone["distance_to_retrain"] is None
    assert row_alone["cosine_to_retrain"] is None
    assert row_with["distance_to_retrain"] == pytest.approx(
        float((final - retrain.params).norm()), rel=1e-6
    )
    assert alone.references == ("original",)
    assert with_retrain.references == ("original", "retrain")
    assert judge.measure(final) == judge.measure(final)  # the same call, the same row


def test_the_controls_are_measured_and_the_client_level_test_is_read(run_dir):
    from fedunlearn.eval.mia.client import ClientMembershipEvidence

    request = UnlearnRequest.of([2])
    seen = []

    def client_test(params):
        """A stand-in scorer: the original scores high, anything 0.5 away from it low."""
        seen.append(params)
        with UnlearnSession(run_dir) as s:
            final = s.run_view.final_params
        score = 5.0 - 10 * float((params - final).norm())
        return ClientMembershipEvidence(
            scores={"candidate": score, "original": 5.0, "retrain": 0.0},
            threshold=2.0,
            target_fpr=0.05,
            power=1.0,
            num_reference_models=4,
            cost_seconds=0.1,
            cost_client_epochs=8.0,
        )

    with UnlearnSession(run_dir) as session:
        verifier = Verifier(session, request, noise_std=1e-3, client_membership=client_test)
        final = session.run_view.final_params
        noisy = verifier.noisy_original_row
        assert noisy is not None
        assert noisy["distance_to_original"] == pytest.approx(1e-3 * final.numel() ** 0.5, rel=0.1)
        moved = final + 1.0 / final.numel() ** 0.5  # 1.0 away from the original
        _, away = verifier.audit(moved, "moved")
        _, same = verifier.audit(final + 1e-6, "noisy")
        assert Verifier(session, request, noise_std=0).noisy_original_row is None
    assert len(seen) == 2
    assert away.check("client_membership").verdict == "pass"
    assert away.influence == "not_detected"  # removed only by an exact lineage
    assert away.detection_limit == {
        "lambda": None,
        "reason": "no clean reference: --reference retrain or the client-level test",
    }
    assert same.check("client_membership").verdict == "fail"
    assert same.influence == "remains"
