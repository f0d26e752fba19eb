"""fedunlearn.testing: the shipped checks fail on a method that breaks the contract."""

import os
import subprocess
import sys

import pytest
from tests.support.examples import finetune_class

from fedunlearn.testing import (
    CHECKS,
    ContractRuns,
    check_declared_reads,
    check_invalid_params,
    check_method,
    check_unusable_history,
    method_checks,
    parametrize_with_checks,
)
from fedunlearn.unlearn import RunOutput

FineTune = finetune_class()


class ClaimsNoStoredRounds(FineTune):
    """Declares it reads no stored round, yet starts from M_T like FineTune."""

    reads_stored_rounds = False


class ClaimsNoRoundModels(FineTune):
    """Declares it reads no global model of rounds 1..T-1, yet starts from M_2."""

    reads_round_models = False

    def _run(self, request, context):
        return RunOutput(context.start_from(2).clone())


class IgnoresItsParams(FineTune):
    """Accepts any hyperparameters (a broken ``__init__``)."""

    def __init__(self, params=None):
        super().__init__(None)


class SkipsItsHistoryCheck(FineTune):
    """Declares it needs policy ``all`` but never checks the run's policy."""

    required_policies = frozenset({"all"})

    def check_history(self, context):
        pass


@pytest.fixture
def runs(run_all, run_none):
    return ContractRuns(run_all, run_none)


def test_a_method_reading_a_stored_round_it_declares_it_does_not_read_fails(runs):
    with pytest.raises(AssertionError, match=r"reads_stored_rounds=False and read \[Read\(round=5"):
        check_declared_reads(ClaimsNoStoredRounds, runs)


def test_a_method_reading_a_round_model_it_declares_it_does_not_read_fails(runs):
    with pytest.raises(AssertionError, match=r"reads_round_models=False and read \[Read\(round=2,"):
        check_declared_reads(ClaimsNoRoundModels, runs)


def test_a_method_accepting_out_of_bounds_params_fails(runs):
    with pytest.raises(AssertionError, match=r"accepted invalid parameters \{'no_such"):
        check_invalid_params(IgnoresItsParams, runs)


def test_a_method_running_on_history_it_declares_it_needs_fails(runs):
    with pytest.raises(AssertionError, match="ran on a run recorded with policy 'none'"):
        check_unusable_history(SkipsItsHistoryCheck, runs)


def test_check_method_names_the_failed_check(runs):
    with pytest.raises(AssertionError, match="^claimsnostoredrounds: check_declared_reads failed"):
        check_method(ClaimsNoStoredRounds, runs)


def test_the_example_method_passes_every_check_and_leaves_no_registration(runs):
    check_method(FineTune, runs)
    from fedunlearn.unlearn import available_methods

    assert "finetune" not in available_methods()


def test_checks_are_yielded_by_name_and_parametrized_with_ids():
    names = [name for name, _ in method_checks("retrain")]
    mark = parametrize_with_checks(["retrain", FineTune]).mark
    assert names == [c.__name__ for c in CHECKS]
    assert len(names) == 7
    assert mark.args[0] == ("method", "check")
    assert mark.kwargs["ids"][0] == "retrain-check_invalid_params"
    assert mark.kwargs["ids"][-1] == "finetune-check_sample_requests"
    assert len(mark.args[1]) == 14


@pytest.mark.slow  # a fresh interpreter importing torch
def test_importing_the_checks_does_not_import_pytest():
    code = "import sys, fedunlearn.testing; print('pytest' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
