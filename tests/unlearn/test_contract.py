"""Every registered method through one suite (scikit-learn's check_estimator in spirit)."""

import hashlib

import pytest
import torch

import fedunlearn.unlearn as unlearn_pkg
from fedunlearn.errors import ConfigError, UnknownMethodError, UnsupportedHistoryError
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, available_methods, make_method

METHODS = available_methods()


def digest(run_dir):
    h = hashlib.sha256()
    for path in sorted(run_dir.rglob("*")):
        # a WAL reader creates an empty -wal and a -shm index next to the database: not content
        empty_wal = path.name.endswith("-wal") and path.stat().st_size == 0
        if path.is_file() and not path.name.endswith((".lock", "-shm")) and not empty_wal:
            h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()


def test_every_method_module_is_registered_and_all_names_import():
    assert {"none", "retrain", "federaser", "random"} <= set(METHODS)
    for name in unlearn_pkg.__all__:
        assert getattr(unlearn_pkg, name) is not None
    with pytest.raises(UnknownMethodError, match="unknown unlearning method 'crabb'; available:"):
        make_method("crabb")


@pytest.mark.parametrize("name", METHODS)
def test_same_inputs_same_result_and_run_dir_untouched(name, run_all):
    before = digest(run_all)
    with UnlearnSession(run_all) as session:
        request = UnlearnRequest.of([0])
        a = session.run(make_method(name), request)
        b = session.run(make_method(name), request)
    assert torch.equal(a.params, b.params)
    assert a.costs.client_epochs == b.costs.client_epochs
    assert digest(run_all) == before


@pytest.mark.parametrize("name", METHODS)
def test_forgetting_nobody_returns_the_original_model_at_no_cost(name, run_all):
    with UnlearnSession(run_all) as session:
        result = session.run(make_method(name), UnlearnRequest.of([]))
        assert torch.equal(result.params, session.final_params)
    assert result.costs.client_epochs == 0 and result.costs.history_bytes_read == 0


@pytest.mark.parametrize("name", METHODS)
def test_costs_are_reported(name, run_all):
    with UnlearnSession(run_all) as session:
        result = session.run(make_method(name), UnlearnRequest.of([1]))
    costs = result.costs
    assert costs.wall_seconds >= 0 and costs.history_bytes_read > 0
    if name != "none":
        assert costs.rounds > 0 and costs.client_epochs > 0 and costs.bytes_communicated > 0
        assert (
            costs.client_participations * 2 * result.params.numel() * 4 == costs.bytes_communicated
        )
        assert len(result.round_metrics) == costs.rounds


@pytest.mark.parametrize("name", METHODS)
def test_unusable_history_fails_before_any_work(name, run_none):
    method = make_method(name)
    with UnlearnSession(run_none) as session:
        context = session.context(UnlearnRequest.of([1]))
        if method.required_policies is None:
            return
        with pytest.raises(UnsupportedHistoryError, match="needs history policy"):
            method.unlearn(UnlearnRequest.of([1]), context)
        assert context.meter.client_epochs == 0 and context.meter.history_bytes_read == 0


def test_invalid_hyperparameters_are_rejected_at_construction():
    with pytest.raises(ConfigError, match="invalid parameters for method 'federaser'"):
        make_method("federaser", {"calibration_ratio": 0})
    with pytest.raises(ConfigError, match="Extra inputs"):
        make_method("retrain", {"rounds": 3})
