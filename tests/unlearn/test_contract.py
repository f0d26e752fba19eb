"""Every registered method through the shipped contract checks (``fedunlearn.testing``).

The checks run on this suite's session runs (``run_all``, ``run_none``: the contract runs'
config). The suite also runs ``finetune`` (examples/finetune-plugin), the worked example of
CONTRIBUTING.md's "Add a method" recipe, registered for these tests only: a method written by
the recipe passes the same checks as the built-in ones.
"""

import importlib
import inspect
import pkgutil

import pytest
from tests.support.examples import finetune_class

import fedunlearn.unlearn as unlearn_pkg
from fedunlearn.errors import ConfigError, UnknownMethodError
from fedunlearn.testing import ContractRuns, parametrize_with_checks
from fedunlearn.unlearn import Unlearner, available_methods, make_method
from fedunlearn.unlearn.registry import registered

BUILT_IN = available_methods()
FineTune = finetune_class()


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


@parametrize_with_checks([*BUILT_IN, FineTune])
def test_method_contract(method, check, run_all, run_none):
    check(ContractRuns(run_all, run_none))


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
