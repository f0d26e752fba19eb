"""The run's DP mechanism re-run: it reproduces training, and makes the receipt's DP Retrain."""

from __future__ import annotations

import pytest
import torch

from fedunlearn.config import parse_config
from fedunlearn.eval import Verifier, reference_retrain
from fedunlearn.eval.references import DPRetrainDetails
from fedunlearn.experiments.compare import compare_methods
from fedunlearn.fl.engine import run_rounds
from fedunlearn.history import HistoryStore
from fedunlearn.privacy.reference import with_run_mechanism
from fedunlearn.runs import build_setup, resolve_config, train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

RUN = {
    "seed": 4,
    "data": {"dataset": "digits", "num_clients": 5},
    "model": {"name": "mlp", "hidden": [16]},
    "training": {"rounds": 3, "local_epochs": 1, "lr": 0.3, "batch_size": 32, "executor": "serial"},
    "attack": {"kind": "backdoor", "num_malicious": 1, "trigger_size": 3},
    "history": {"policy": "fedadp"},
}
MECHANISMS = {
    "client_update": {"enabled": True, "clip_norm": 0.5, "epsilon_max": 3.0},
    "dp_sgd": {"enabled": True, "mechanism": "dp_sgd", "clip_norm": 1.0},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dp_reference")
    out = {}
    for name, privacy in {**MECHANISMS, "store_only": None}.items():
        if privacy is None:
            privacy = {**MECHANISMS["client_update"], "dp_scope": "store_only"}
        cfg = parse_config({**RUN, "privacy": privacy})
        train_run(cfg, root / name)
        out[name] = (root / name, cfg)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_the_run_mechanism_at_the_stored_budgets_reproduces_training(runs, mechanism):
    run_dir, cfg = runs[mechanism]
    setup = build_setup(resolve_config(cfg))
    with HistoryStore.open(run_dir / "history") as store:
        # the run's own budgets and draws (a release uses ε_max and a salt of its own)
        fed = with_run_mechanism(
            setup.federation,
            cfg.privacy,
            store.round_scalars,
            seed=cfg.seed,
            epsilon_of=lambda r: store.round_scalars(r)["dp_epsilon"],
        )
        try:
            final = run_rounds(fed, setup.aggregator, store.read_model(0), num_rounds=3)
        finally:
            fed.close()
            setup.close()
        assert torch.equal(final, store.read_model(3))  # same noise, round for round


@pytest.mark.slow
def test_store_only_and_runs_without_dp_have_no_mechanism_to_rerun(runs):
    run_dir, cfg = runs["store_only"]
    with HistoryStore.open(run_dir / "history") as store:
        assert with_run_mechanism(None, cfg.privacy, store.round_scalars, seed=1) is None
        clean = parse_config(RUN).privacy
        assert with_run_mechanism(None, clean, store.round_scalars, seed=1) is None


@pytest.mark.slow
def test_the_receipt_judges_a_dp_run_against_dp_retrain(runs):
    run_dir, _ = runs["client_update"]
    request = UnlearnRequest.of([0])
    with UnlearnSession(run_dir) as session:
        reference = reference_retrain(session, request, "retrain")
        plain = session.run(make_method("retrain"), request)
        verifier = Verifier(session, request, retrain=reference)
        result = verifier.verify(session.run(make_method("fedadp"), request))
    assert isinstance(reference.details, DPRetrainDetails)
    assert reference.details.mechanism == "client_update"
    assert reference.costs.client_epochs == plain.costs.client_epochs
    assert not torch.equal(reference.params, plain.params)  # the noise is in the reference
    utility = next(c for c in result.verification.checks if c.name == "utility")
    assert "DP Retrain" in utility.reason
    with UnlearnSession(runs["store_only"][0]) as session:  # trained on clean uploads
        same = reference_retrain(session, request, "retrain")
        assert torch.equal(same.params, session.run(make_method("retrain"), request).params)


@pytest.mark.slow
def test_compare_judges_a_dp_run_against_dp_retrain(runs):
    doc = compare_methods(runs["client_update"][0], [0], ["fedadp"])
    fedadp = next(r for r in doc["methods"] if r["method"] == "fedadp")
    utility = next(c for c in fedadp["verification"]["checks"] if c["name"] == "utility")
    assert "DP Retrain" in utility["reason"]
    retrain = next(r for r in doc["methods"] if r["method"] == "retrain")
    assert retrain["details"] == {}  # the table's Retrain row stays the noise-free one
