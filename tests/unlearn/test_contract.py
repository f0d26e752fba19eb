"""Every registered method through one suite (scikit-learn's check_estimator in spirit).

The suite also runs ``finetune`` (tests/support/finetune), the worked example of CONTRIBUTING.md's
"Add a method" recipe, registered for these tests only: a method written by the recipe passes
the same checks as the built-in ones.
"""

import importlib
import inspect
import pkgutil

import pytest
import torch
from tests.support import digest
from tests.support.finetune import FineTune

import fedunlearn.unlearn as unlearn_pkg
from fedunlearn.errors import ConfigError, UnknownMethodError, UnsupportedHistoryError
from fedunlearn.unlearn import (
    Details,
    Unlearner,
    UnlearnRequest,
    UnlearnSession,
    available_methods,
    make_method,
)
from fedunlearn.unlearn.registry import registered

BUILT_IN = available_methods()
METHODS = [*BUILT_IN, "finetune"]


@pytest.fixture(autouse=True)
def example_method():
    """Register the recipe's example method for each test of this module only."""
    with registered("finetune", FineTune):
        yield


def test_every_method_class_is_registered_and_all_names_import():
    assert {"none", "retrain", "federaser", "fedrecover", "random"} <= set(BUILT_IN)
    assert {"crab", "fedadp", "starfish"} <= set(BUILT_IN)
    for name in unlearn_pkg.__all__:
        assert getattr(unlearn_pkg, name) is not None
    defined = set()
    for info in pkgutil.walk_packages(unlearn_pkg.__path__, "fedunlearn.unlearn."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Unlearner) and cls is not Unlearner and not inspect.isabstract(cls):
                defined.add(cls)
    registered_classes = {unlearn_pkg.get_method(n) for n in BUILT_IN}
    assert defined == registered_classes, "a method class is defined but not registered"
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
    assert a.details == b.details
    assert digest(run_all) == before


@pytest.mark.parametrize("name", METHODS)
def test_forgetting_nobody_returns_the_original_model_at_no_cost(name, run_all):
    with UnlearnSession(run_all) as session:
        result = session.run(make_method(name), UnlearnRequest.of([]))
        assert torch.equal(result.params, session.run_view.final_params)
    assert result.costs.client_epochs == 0
    assert result.lineage is not None and result.lineage.exact
    assert result.costs.history_bytes_read == 0


@pytest.mark.parametrize("name", METHODS)
def test_costs_and_typed_details_are_reported(name, run_all):
    with UnlearnSession(run_all) as session:
        result = session.run(make_method(name), UnlearnRequest.of([1]))
    costs = result.costs
    assert costs.wall_seconds >= 0
    assert costs.history_bytes_read > 0
    assert isinstance(result.details, Details)
    assert isinstance(result.details.to_dict(), dict)
    # every method's result says what it was computed from, from the start model it declared
    lineage = result.lineage
    assert lineage is not None and lineage.kind in ("exact", "approximate")
    assert lineage.start_round is not None, f"{name} does not call context.start_from"
    assert lineage.first_tainted_round is not None  # client 1 took part in this run
    if name != "none":
        assert costs.rounds > 0
        assert costs.client_epochs > 0
        assert costs.bytes_communicated > 0
        assert (
            costs.client_participations * 2 * result.params.numel() * 4 == costs.bytes_communicated
        )
        assert len(result.round_metrics) == costs.rounds


@pytest.mark.parametrize("name", METHODS)
def test_unusable_history_fails_before_any_work(name, run_none):
    """On a run that kept no client update, a method needing some refuses before any work;
    a method needing none (``required_policies is None``) must work on it."""
    method = make_method(name)
    request = UnlearnRequest.of([1])
    with UnlearnSession(run_none) as session:
        context = session.context(request)
        if method.required_policies is None:
            result = method.unlearn(request, context)
            assert result.params.shape == session.run_view.final_params.shape
            assert torch.isfinite(result.params).all()
        else:
            with pytest.raises(UnsupportedHistoryError, match="needs history policy"):
                method.unlearn(request, context)
            assert context.meter.costs.client_epochs == 0
            assert context.meter.costs.history_bytes_read == 0


def test_invalid_hyperparameters_are_rejected_at_construction():
    with pytest.raises(ConfigError, match="invalid parameters for method 'federaser'"):
        make_method("federaser", {"calibration_ratio": 0})
    with pytest.raises(ConfigError, match="Extra inputs"):
        make_method("retrain", {"rounds": 3})
    with pytest.raises(ConfigError, match="invalid parameters for method 'finetune'"):
        make_method("finetune", {"rounds": 0})


def test_a_method_registered_for_a_test_is_gone_afterwards():
    assert "finetune" in available_methods()  # the autouse fixture registered it
    assert "finetune" not in BUILT_IN
