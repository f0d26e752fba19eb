"""The client-level test with a null from held-out data: no reference trained (issue 34)."""

import contextlib
import math
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch

from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError
from fedunlearn.eval import ReceiptOptions, open_receipts
from fedunlearn.eval.mia.heldout import (
    exchangeable,
    held_out_client_test,
    held_out_df,
    held_out_z,
)
from fedunlearn.eval.receipt.thresholds import VerificationThresholds
from fedunlearn.eval.references import (
    CONTINUED_ROUNDS,
    HELD_OUT_LIMIT,
    client_membership_check,
)
from fedunlearn.fl.client import local_update
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method
from fedunlearn.unlearn.receipt import (
    NO_LIMIT_CODE,
    Check,
    influence_basis,
    influence_verdict,
)

TINY = {
    "seed": 3,
    "data": {"dataset": "digits", "num_clients": 6},
    "model": {"name": "mlp", "hidden": [16]},
    "training": {"rounds": 3, "local_epochs": 1, "lr": 0.1, "batch_size": 64},
    "attack": {"kind": "label_flip", "num_malicious": 1},
    "history": {"policy": "all"},
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("held_out") / "run"
    train_run(parse_config(TINY), out)
    return out


def _honest(session: UnlearnSession) -> int:
    return min(set(session.federation.client_ids) - session.federation.malicious)


@contextlib.contextmanager
def _held_out_receipts(trained, tmp_path):
    """A copy of the run, Retrain of an honest client, and its receipts under the held-out null."""
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    with UnlearnSession(run, evaluate=False) as session:
        request = UnlearnRequest.of([_honest(session)])
        retrain = session.run(make_method("retrain"), request)
        options = ReceiptOptions("retrain", client_test_references="held_out")
        yield session, retrain, open_receipts(session, request, options, retrain=retrain)


def test_z_is_zero_for_the_anchor_and_grows_with_a_shift_on_the_clients_only():
    rng = np.random.default_rng(0)
    y_c, y_t = rng.integers(0, 3, 120), rng.integers(0, 3, 300)
    assert held_out_z(np.zeros(120), y_c, np.zeros(300), y_t) == 0.0
    noise_c, noise_t = rng.normal(0, 1, 120), rng.normal(0, 1, 300)
    assert abs(held_out_z(noise_c, y_c, noise_t, y_t)) < 3.0
    assert held_out_z(noise_c + 1.0, y_c, noise_t, y_t) > 6.0
    assert math.isnan(held_out_z(noise_c, y_c, noise_t, y_t + 10))  # no class in common
    assert math.isnan(held_out_z(noise_c * np.nan, y_c, noise_t, y_t))


def test_z_compares_within_classes_so_label_skew_alone_is_not_a_flag():
    # class 1 has a higher d for every model; the clients hold mostly class 1 (label skew)
    rng = np.random.default_rng(1)
    y_c = np.array([1] * 100 + [0] * 20)
    y_t = np.array([1] * 150 + [0] * 150)
    d_c = rng.normal(0, 0.1, 120) + 2.0 * (y_c == 1)
    d_t = rng.normal(0, 0.1, 300) + 2.0 * (y_t == 1)
    assert abs(held_out_z(d_c, y_c, d_t, y_t)) < 3.0
    pooled = (d_c.mean() - d_t.mean()) / math.sqrt(d_c.var() / 120 + d_t.var() / 300)
    assert pooled > 5.0  # an unstratified comparison would flag the skew


def test_an_attacker_or_a_shard_split_has_no_exchangeable_null(trained, tmp_path):
    with UnlearnSession(trained, evaluate=False) as session:
        attacker = min(session.federation.malicious)
        honest = _honest(session)
        assert exchangeable(session, frozenset({honest})) is None
        assert "attack" in (exchangeable(session, frozenset({attacker})) or "")
        test, why = held_out_client_test(session, [attacker], session.run_view.final_params)
        assert test is None
        assert "attack" in why
        with pytest.raises(ConfigError):
            held_out_client_test(session, [], session.run_view.final_params)
    shards = tmp_path / "shards"
    train_run(parse_config({**TINY, "data": {**TINY["data"], "partition": "shards"}}), shards)
    with UnlearnSession(shards, evaluate=False) as session:
        assert "partition" in (exchangeable(session, frozenset({_honest(session)})) or "")


@pytest.mark.slow
def test_a_test_set_without_the_clients_classes_falls_back_to_per_request(tmp_path):
    # review of b9836c9: a Dirichlet split whose small test set holds fewer than 2 examples of
    # every class client 0 holds (3: 1 of 1, 6: 135 of 0) scored NaN (verdict invalid) by
    # default instead of falling back to the per-request references as the design says
    config = {
        **TINY,
        "seed": 0,
        "data": {
            "dataset": "digits",
            "num_clients": 6,
            "partition": "dirichlet",
            "alpha": 0.05,
            "max_test_samples": 10,
        },
        "attack": {"kind": "none"},
    }
    run = tmp_path / "run"
    train_run(parse_config(config), run)
    with UnlearnSession(run, evaluate=False) as session:
        held = session.federation.client_data[0].y
        assert torch.bincount(held, minlength=10)[[3, 6]].tolist() == [1, 135]
        assert torch.bincount(session.evaluation.y_test, minlength=10)[6] == 0
        assert exchangeable(session, frozenset({0})) is None  # the split itself is random
        test, why = held_out_client_test(session, [0], session.run_view.final_params)
        assert test is None
        assert "class" in why
        # a client whose classes the test set does cover is still scored
        covered, _ = held_out_client_test(session, [4], session.run_view.final_params)
        assert covered is not None


def test_retrain_scores_zero_and_a_model_tuned_on_the_client_is_flagged(trained):
    with UnlearnSession(trained, evaluate=False) as session:
        client = _honest(session)
        request = UnlearnRequest.of([client])
        retrain = session.run(make_method("retrain"), request)
        tuned = (
            retrain.params
            + local_update(
                session.federation.model,
                retrain.params,
                session.federation.client_data[client],
                replace(session.federation.spec, epochs=20),
                seed=0,
            ).delta
        )
        test, why = held_out_client_test(session, [client], retrain.params)
        assert test is not None, why
        original = session.run_view.final_params
        ev = test.evidence({"original": original, "retrain": retrain.params, "tuned": tuned})
        nan_ev = test.evidence({"original": original, "nan": torch.full_like(original, math.nan)})
    assert ev.scores["retrain"] == 0.0
    assert ev.scores["tuned"] > ev.threshold
    assert 2.3263 < ev.threshold < 2.45  # one-sided 1%, Student-t for ~50 examples
    assert math.isnan(nan_ev.scores["nan"])  # judged invalid (inconclusive) by the rule
    assert ev.cost_client_epochs == 0.0
    assert ev.num_reference_models == 0
    assert ev.power is not None
    assert len(ev.notes["in_scores"]) == 3  # the run's 3 stored global models


@pytest.mark.slow
def test_the_receipt_option_costs_only_the_continued_controls(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    assert ReceiptOptions("retrain", client_test_references="held_out")
    with UnlearnSession(run, evaluate=False) as session:
        client = _honest(session)
        request = UnlearnRequest.of([client])
        retrain = session.run(make_method("retrain"), request)
        test = client_membership_check(session, request, retrain, references="held_out")
        attacker = min(session.federation.malicious)
        fallback = client_membership_check(
            session, UnlearnRequest.of([attacker]), references="held_out", max_seconds=60
        )
        evidence = test(retrain.params)
    remaining = 5  # 6 clients, one forgotten; 1 local epoch
    assert test.cost_client_epochs == CONTINUED_ROUNDS * remaining
    assert evidence.notes["references"] == "held_out"
    assert evidence.scores["candidate"] == 0.0
    assert fallback.cost_client_epochs > test.cost_client_epochs  # per-request references
    assert "attack" in fallback(retrain.params).notes["held_out"]


@pytest.mark.slow
def test_the_detection_limit_never_counts_the_held_out_tests_flags(trained, tmp_path):
    # anchored on Retrain, the score is scale-free on Retrain's own line: a limit measured there
    # claimed the smallest step (0.05), and one from Retrain continued 0.05 or 0.1 on the
    # quickstart, where an exact retrain plus 0.1 of the offset was not flagged. So its flags
    # are not counted; the limit is the other checks' (it was "not measured" for every check,
    # and a not_detected resting on the membership check then stated no limit: on a Dirichlet
    # split, weight mixtures 0.1-0.3 were not_detected with no limit)
    with _held_out_receipts(trained, tmp_path) as (session, retrain, receipts):
        limit = receipts.verifier.detection_limit()
        step = retrain.params + 0.75 * (session.run_view.final_params - retrain.params)
        _, at_step = receipts.audit(step, "lambda 0.75")
    assert at_step.check("client_membership").verdict == "fail"  # it flags the step...
    assert limit["measured"]["0.75"] == []  # ...which the limit does not count
    assert all("client-level membership" not in flags for flags in limit["measured"].values())
    assert limit["lambda"] == 1.0  # the distance check flags the original only
    assert limit["by"] == ["distance to Retrain"]
    assert limit["not_counted"] == {"client-level membership": HELD_OUT_LIMIT}


def test_user_data_has_no_exchangeable_null_even_when_it_is_digits(trained, tmp_path):
    # a run on user data keeps data.dataset "digits" in its config: the config alone said
    # exchangeable, and honest retrains on a client whose images were shifted one pixel scored
    # 4.93, 3.57, 2.99 against the threshold 2.36 (a false "remains")
    with UnlearnSession(trained, evaluate=False) as session:
        honest = _honest(session)
        clients = {c: (d.x, d.y) for c, d in session.federation.client_data.items()}
        user = {"clients": clients, "test": (session.evaluation.x_test, session.evaluation.y_test)}
    with UnlearnSession(trained, evaluate=False, data=user) as session:  # data given here
        why = exchangeable(session, frozenset({honest}))
        test, fallback = held_out_client_test(session, [honest], session.run_view.final_params)
    assert "user data" in (why or "")
    assert test is None
    assert "user data" in fallback
    recorded = tmp_path / "user"
    train_run(parse_config(TINY), recorded, data=user)  # in the store
    with UnlearnSession(recorded, evaluate=False, data=user) as session:
        assert "user data" in (exchangeable(session, frozenset({honest})) or "")


def test_the_degrees_of_freedom_count_both_sides_and_only_the_classes_scored():
    # class 2 has one client example: held_out_z leaves it out, so the df does too
    y_c = np.array([0, 0, 0, 1, 1, 2])
    y_t = np.array([0, 0, 1, 1, 1, 1, 2, 2])
    # Welch-Satterthwaite over (class, side) terms w_k^2 / n with one variance:
    # class 0: w 0.6, n 3 and 2; class 1: w 0.4, n 2 and 4
    terms = [(0.36 / 3, 2), (0.36 / 2, 1), (0.16 / 2, 1), (0.16 / 4, 3)]
    expected = sum(a for a, _ in terms) ** 2 / sum(a * a / df for a, df in terms)
    assert held_out_df(y_c, y_t) == pytest.approx(expected)  # 3.79, not the old 6 - 3 = 3
    assert held_out_df(y_c, y_t) == pytest.approx(3.7908, abs=1e-4)
    assert held_out_df(np.array([0, 1]), y_t) == 0.0  # no class left: no test


@pytest.mark.slow
def test_the_receipt_names_its_null_the_fallback_and_the_anchor(trained, tmp_path):
    # the receipt's JSON never said which null was used, why the held-out one fell back, or
    # that its anchor came from the caller
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    options = ReceiptOptions("retrain", client_test_references="held_out", client_test_seconds=60)
    with UnlearnSession(run, evaluate=False) as session:
        attacker = min(session.federation.malicious)
        honest = UnlearnRequest.of([_honest(session)])
        retrain = session.run(make_method("retrain"), honest)
        given = open_receipts(session, honest, options, retrain=retrain)
        _, held = given.audit(retrain.params, "retrain")
        trained_anchor = open_receipts(session, honest, options)
        _, own = trained_anchor.audit(retrain.params, "retrain")
        fallback = open_receipts(session, UnlearnRequest.of([attacker]), options)
        _, fell = fallback.audit(session.run_view.final_params, "original")
        per_request = open_receipts(
            session, honest, replace(options, client_test_references="per_request")
        )
        _, plain = per_request.audit(retrain.params, "retrain")
    check = held.check("client_membership")
    assert check.evidence["references"] == "held_out"
    assert check.evidence["anchor"] == "given by the caller"
    assert "held_out_null" in check.codes
    assert "tuned on" in check.reason
    assert "given by the caller" in check.reason
    assert own.check("client_membership").evidence["anchor"] == "trained by the receipt"
    assert "given by the caller" not in own.check("client_membership").reason
    check = fell.check("client_membership")
    assert check.evidence["references"] == "per_request"
    assert "attack" in check.evidence["held_out_fallback"]
    assert "held_out_fallback" in check.codes
    assert "references trained per request" in check.reason
    check = plain.check("client_membership")
    assert check.evidence["references"] == "per_request"
    assert not {"held_out_null", "held_out_fallback"} & set(check.codes)


def _check(name, verdict, *, decisive=True, codes=(), aspect="influence"):
    return Check(name, name, verdict, aspect=aspect, decisive=decisive, codes=codes)


def test_a_pass_of_the_held_out_null_alone_is_not_shown_for_want_of_a_limit():
    # the held-out null states no detection limit, yet its pass alone made a receipt say
    # not_detected, whose promise is a stated limit: on a Dirichlet split a model fine-tuned 20
    # epochs on the client, Crab's warned rollback and off-line mixtures were not_detected
    held = _check("client_membership", "pass", decisive=False, codes=("pass", NO_LIMIT_CODE))
    distance = _check("distance", "pass", decisive=False, codes=("pass",))
    verdict, basis, rest = influence_basis([held, distance], None)
    assert (verdict, basis) == ("not_shown", "no_limit")
    assert [c.name for c in rest] == ["client_membership"]
    influence, reason = influence_verdict([held, distance], None, ("original", "retrain"))
    assert influence == "not_shown"
    assert "no detection limit" in reason
    # another decisive check with power still grounds not_detected
    backdoor = _check("backdoor", "pass")
    assert influence_basis([held, backdoor], None)[:2] == ("not_detected", "powered_pass")
    # a flag of the held-out null is still remains; an exact lineage still removed
    flagged = _check("client_membership", "fail", decisive=False, codes=("fail", NO_LIMIT_CODE))
    assert influence_basis([flagged, distance], None)[:2] == ("remains", "flagged")
    assert influence_basis([held], {"kind": "exact"})[:2] == ("removed", "exact_lineage")
    # the method's own warning comes first, as with a decisive pass
    warns = _check("method_warnings", "warn", aspect="method")
    assert influence_basis([held, warns], None)[:2] == ("not_shown", "method_warns")
    # without the held-out pass nothing has power
    assert influence_basis([distance], None)[:2] == ("not_shown", "no_power")


def test_a_no_limit_receipt_names_the_null_that_would_state_a_limit():
    # review of 6c37694: the no_limit reason said evidence would come from participation
    # markers (embedded at training time, too late) and never named the per-request null,
    # which states a limit and is one flag away
    held = _check("client_membership", "pass", decisive=False, codes=("pass", NO_LIMIT_CODE))
    _, reason = influence_verdict([held], None, ("original", "retrain"))
    assert "--client-test-references per_request" in reason
    per_request = _check("client_membership", "inconclusive", codes=("no_power",))
    _, reason = influence_verdict([per_request], None, ("original", "retrain"))
    assert "--client-test-references" not in reason


@pytest.mark.slow
def test_the_held_out_receipt_of_a_clean_model_is_not_shown_and_of_the_original_remains(
    trained, tmp_path
):
    with _held_out_receipts(trained, tmp_path) as (session, retrain, receipts):
        _, clean = receipts.audit(retrain.params, "retrain, bare")
        _, original = receipts.audit(session.run_view.final_params, "original")
    check = clean.check("client_membership")
    assert check.verdict == "pass"
    assert check.decisive is False
    assert (clean.influence, clean.influence_basis) == ("not_shown", "no_limit")
    assert original.check("client_membership").verdict == "fail"
    assert original.influence == "remains"


@pytest.mark.slow
def test_a_not_detected_receipt_beside_the_held_out_null_states_its_other_checks_limit(
    trained, tmp_path
):
    # review of 6c37694: with the held-out null a not_detected rests on another decisive check
    # (here sample-level membership, given power by lower thresholds), yet the detection limit
    # was not measured at all because the held-out test states none: a not_detected without
    # the limit it promises. The limit is now measured on the checks that state one.
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    low = VerificationThresholds(
        mia_auc_warn=0.002, mia_auc_fail=0.004, mia_warn_z=0.2, mia_fail_z=0.2
    )
    with UnlearnSession(run, evaluate=False) as session:
        request = UnlearnRequest.of([_honest(session)])
        retrain = session.run(make_method("retrain"), request)
        options = ReceiptOptions("retrain", low, client_test_references="held_out")
        receipts = open_receipts(session, request, options, retrain=retrain)
        _, clean = receipts.audit(retrain.params, "retrain, bare")
    assert clean.check("client_membership").verdict == "pass"
    assert clean.check("membership").verdict == "pass"
    assert (clean.influence, clean.deciding) == ("not_detected", ["membership"])
    limit = clean.detection_limit
    assert limit is not None
    assert limit["lambda"] is not None, limit
    assert "membership" in limit["by"]
    assert limit["not_counted"] == {"client-level membership": HELD_OUT_LIMIT}
    flagged = {title for titles in limit["measured"].values() for title in titles}
    assert "client-level membership" not in flagged  # it flags every step: scale-free
    assert f"{limit['lambda']:.2f}" in clean.influence_reason
    assert "client-level membership is not counted" in clean.influence_reason
