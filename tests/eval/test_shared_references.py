"""The client-level test's shared references: one training per run generation (issue 34)."""

import json
import shutil

import pytest
import torch

from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError
from fedunlearn.eval import ReceiptOptions, open_receipts
from fedunlearn.eval.mia.shared_references import (
    MANIFEST,
    load_or_train_shared,
    shared_client_test,
)
from fedunlearn.eval.references import client_membership_check
from fedunlearn.runs import train_run
from fedunlearn.runs.lifecycle import apply_model
from fedunlearn.runs.rundir import REFERENCES_CACHE_DIR
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

TINY = {
    "seed": 3,
    "data": {"dataset": "digits", "num_clients": 6},
    "model": {"name": "mlp", "hidden": [8]},
    "training": {"rounds": 2, "local_epochs": 1, "lr": 0.1, "batch_size": 64},
    "history": {"policy": "none"},
}
# 6 shared references on halves of 6 clients, 2 rounds of 3 clients, 1 local epoch each
SHARED_EPOCHS = 6 * 2 * 3


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("shared_refs") / "run"
    train_run(parse_config(TINY), out)
    return out


@pytest.fixture
def run(trained, tmp_path):
    """A fresh copy of the trained run (no cache yet), for tests that change it."""
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    return copy


def test_a_second_request_reads_the_cache_and_trains_nothing(run):
    with UnlearnSession(run, evaluate=False) as session:
        first = shared_client_test(session, [1])
    with UnlearnSession(run, evaluate=False) as session:  # another request, another process
        second = shared_client_test(session, [2])
        refs = load_or_train_shared(session)
    assert first is not None
    assert second is not None
    assert first.cost_client_epochs == SHARED_EPOCHS
    assert second.cost_client_epochs == 0.0
    assert second.notes["shared_references"]["cached"] is True
    assert second.notes["shared_references"]["client_epochs"] == SHARED_EPOCHS
    # every client is "in" half the references and "out" of the other half
    assert (first.notes["num_in"], first.notes["num_out"]) == (3, 3)
    assert (second.notes["num_in"], second.notes["num_out"]) == (3, 3)
    assert refs.cached
    assert len(refs.params) == 6
    assert all(len(m) == 3 for m in refs.members)


def test_the_cached_references_are_the_trained_ones_bit_for_bit(run):
    with UnlearnSession(run, evaluate=False) as session:
        trained = load_or_train_shared(session)
        read = load_or_train_shared(session)
    assert trained is not None
    assert read is not None
    assert not trained.cached
    assert read.cached
    assert all(torch.equal(a, b) for a, b in zip(trained.params, read.params, strict=True))
    assert trained.members == read.members


def test_an_apply_invalidates_the_shared_references(run):
    with UnlearnSession(run, evaluate=False) as session:
        assert shared_client_test(session, [2]) is not None
        retrain = session.run(make_method("retrain"), UnlearnRequest.of([1]))
    apply_model(run, retrain.params, [1], method="retrain")
    with UnlearnSession(run, evaluate=False) as session:
        assert session.run_view.generation == 1
        after = shared_client_test(session, [2])
    assert after is not None
    assert after.notes["shared_references"]["cached"] is False
    assert after.cost_client_epochs > 0
    # the stale generation's file is gone
    assert len(list((run / REFERENCES_CACHE_DIR).glob("*.pt"))) == 1


def test_a_tampered_cache_is_refused_and_trained_again(run):
    with UnlearnSession(run, evaluate=False) as session:
        trained = load_or_train_shared(session)
    folder = run / REFERENCES_CACHE_DIR
    blob = folder / json.loads((folder / MANIFEST).read_text())["file"]
    data = bytearray(blob.read_bytes())
    data[-10] ^= 0xFF
    blob.write_bytes(bytes(data))
    with UnlearnSession(run, evaluate=False) as session:
        again = load_or_train_shared(session)
        test = shared_client_test(session, [0])
    assert again is not None
    assert trained is not None
    assert not again.cached
    assert "SHA-256" in again.note
    assert all(torch.equal(a, b) for a, b in zip(trained.params, again.params, strict=True))
    assert test is not None
    assert test.notes["shared_references"]["cached"] is True


def test_a_request_the_halves_split_falls_back_to_per_request_references(run):
    with UnlearnSession(run, evaluate=False) as session:
        refs = load_or_train_shared(session)
        assert refs is not None
        # five of six clients: no half holds them all, none holds none of them
        assert shared_client_test(session, [0, 1, 2, 3, 4]) is None
        retrain = session.run(make_method("retrain"), UnlearnRequest.of([0, 1, 2, 3, 4]))
        check = client_membership_check(
            session, UnlearnRequest.of([0, 1, 2, 3, 4]), retrain, references="shared"
        )
    assert check.shared is None
    assert check.cost_client_epochs > 0


@pytest.mark.parametrize("count", [3, 5, 2, "6"])
def test_bad_counts_raise_one_clear_line(trained, count):
    with UnlearnSession(trained, evaluate=False) as session:
        with pytest.raises(ConfigError, match="even int >= 4"):
            load_or_train_shared(session, count=count)


def test_receipt_options_refuse_an_unknown_reference_source():
    with pytest.raises(ConfigError, match="client_test_references must be one of"):
        ReceiptOptions(client_test_references="both")


ATTACKED = {
    "seed": 0,
    "data": {"dataset": "digits", "num_clients": 6},
    "model": {"name": "mlp", "hidden": [16]},
    "training": {"rounds": 5, "local_epochs": 1, "lr": 0.1, "batch_size": 32},
    "attack": {"kind": "backdoor", "num_malicious": 1, "target_label": 0, "trigger_size": 3},
    "history": {"policy": "none"},
}


@pytest.mark.slow
def test_shared_test_on_a_forgotten_attacker_original_remains_retrain_does_not(tmp_path):
    run = tmp_path / "run"
    train_run(parse_config(ATTACKED), run)
    options = ReceiptOptions("retrain", client_test_references="shared")
    costs = []
    for _ in range(2):  # the second request reads the first one's references
        with UnlearnSession(run) as session:
            request = UnlearnRequest.of(sorted(session.run_view.malicious))
            retrain = session.run(make_method("retrain"), request)
            receipts = open_receipts(session, request, options, retrain=retrain)
            _, original = receipts.audit(session.run_view.final_params, "original")
            _, bare = receipts.audit(retrain.params, "retrain (bare)")
            verified = receipts.verify(retrain).verification
        assert original.influence == "remains"
        assert original.check("client_membership").verdict == "fail"
        assert bare.influence == "not_detected"
        assert bare.check("client_membership").verdict == "pass"
        assert verified is not None
        assert verified.influence == "removed"
        costs.append(original.cost)
    assert costs[0]["references"]["client test"]["client_epochs"] == 6 * 5 * 3
    assert costs[1]["references"]["client test"]["client_epochs"] == 0.0
    assert costs[1]["client_test_shared"]["cached"] is True
