"""The method contract, shipped: checks a third-party unlearning method runs in its own tests.

scikit-learn's ``check_estimator`` / ``parametrize_with_checks``, for ``Unlearner``::

    from fedunlearn.testing import parametrize_with_checks

    @parametrize_with_checks([MyMethod])          # classes or registered names
    def test_contract(method, check):
        check()                                   # trains the small contract runs once

``method_checks(method)`` yields ``(check name, check)`` pairs, ``check_method(method)`` runs
them all and raises ``AssertionError`` naming the failed one. The checks (listed in
:mod:`fedunlearn.testing.checks`) include the capability flags: what a method declares it reads
(``reads_round_models``, ``reads_stored_rounds``) is compared with what the context's
``MeteredHistory`` logged. They run on two small finished runs
(:mod:`fedunlearn.testing.runs`): ``contract_runs()`` trains them into a temporary directory
once per process, ``train_contract_runs(directory)`` into yours (a session fixture's directory).

pytest is not a dependency of the library: ``parametrize_with_checks`` imports it when called.
"""

from fedunlearn.testing.checks import (
    CHECKS,
    MethodSpec,
    check_costs_and_details,
    check_declared_reads,
    check_deterministic,
    check_forget_nobody,
    check_invalid_params,
    check_method,
    check_sample_requests,
    check_unusable_history,
    method_checks,
    parametrize_with_checks,
)
from fedunlearn.testing.runs import (
    ContractRuns,
    contract_config,
    contract_runs,
    run_dir_digest,
    train_contract_runs,
)

__all__ = [
    "CHECKS",
    "ContractRuns",
    "MethodSpec",
    "check_costs_and_details",
    "check_declared_reads",
    "check_deterministic",
    "check_forget_nobody",
    "check_invalid_params",
    "check_method",
    "check_sample_requests",
    "check_unusable_history",
    "contract_config",
    "contract_runs",
    "method_checks",
    "parametrize_with_checks",
    "run_dir_digest",
    "train_contract_runs",
]
