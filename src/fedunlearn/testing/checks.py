"""The method contract: checks every unlearning method must pass (scikit-learn's check_estimator).

Each check takes the method (its registered name or its ``Unlearner`` class) and the finished
runs it works on (``fedunlearn.testing.runs.ContractRuns``) and raises ``AssertionError`` (or the
method's own exception) when the method breaks the contract:

- ``check_deterministic``: the same inputs give the same model, costs and details, and the run
  directory is left byte for byte as it was;
- ``check_forget_nobody``: forgetting nobody returns the run's final model at zero cost with an
  exact lineage;
- ``check_costs_and_details``: costs, typed ``Details`` and a lineage from a declared start
  (``context.start_from``) are reported; a method that trains counts rounds, epochs and bytes;
- ``check_unusable_history``: on a run that kept no client update, a method needing some
  (``required_policies``) refuses before any work, and a method needing none works;
- ``check_invalid_params``: an unknown hyperparameter and every value outside a field's declared
  bounds are refused at construction (``ConfigError``);
- ``check_declared_reads``: the capability flags agree with what the method read (the context's
  ``ReadLog``, which ``MeteredHistory`` fills): ``reads_round_models = False`` reads no global
  model or aggregate of rounds 1..T-1, ``reads_stored_rounds = False`` reads no stored payload
  but M_0;
- ``check_sample_requests``: a method without ``serves_samples`` refuses a sample-level request
  before any work.

``method_checks`` yields ``(check name, check)`` pairs bound to one method, ``check_method`` runs
them all, ``parametrize_with_checks`` turns them into a pytest parametrization.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import annotated_types
import torch

from fedunlearn.errors import ConfigError, UnknownMethodError, UnsupportedHistoryError
from fedunlearn.testing.runs import ContractRuns, contract_runs, run_dir_digest
from fedunlearn.unlearn.base import Details, Unlearner, UnlearnRequest
from fedunlearn.unlearn.context import UnlearnContext
from fedunlearn.unlearn.lineage import Read
from fedunlearn.unlearn.registry import get_method, registered
from fedunlearn.unlearn.session import UnlearnSession

if TYPE_CHECKING:
    import pytest

__all__ = [
    "CHECKS",
    "MethodSpec",
    "check_costs_and_details",
    "check_declared_reads",
    "check_deterministic",
    "check_forget_nobody",
    "check_invalid_params",
    "check_method",
    "check_sample_requests",
    "check_unusable_history",
    "method_checks",
    "parametrize_with_checks",
]

#: A method as the checks take it: its registered name, or its class (registered for the check
#: under its ``name`` if it has one, else its lower-cased class name).
MethodSpec = str | type[Unlearner[Any]]
Check = Callable[[ContractRuns | None], None]


def _resolve(method: MethodSpec) -> tuple[str, type[Unlearner[Any]]]:
    """Return the method's name and class."""
    if isinstance(method, str):
        return method, get_method(method)
    name = method.__dict__.get("name") or method.__name__.lower()
    return str(name), method


def _registered(name: str, cls: type[Unlearner[Any]]) -> AbstractContextManager[Any]:
    """Register ``cls`` as ``name`` for a check, unless it already is."""
    try:
        if get_method(name) is cls:
            return nullcontext()
    except UnknownMethodError:
        pass
    return registered(name, cls)


def _method_check(
    body: Callable[[str, type[Unlearner[Any]], ContractRuns], None],
) -> Callable[[MethodSpec, ContractRuns | None], None]:
    """Turn ``body(name, cls, runs)`` into a check ``(method, runs=None)`` (method registered)."""

    @functools.wraps(body)
    def check(method: MethodSpec, runs: ContractRuns | None = None) -> None:
        name, cls = _resolve(method)
        with _registered(name, cls):
            body(name, cls, runs if runs is not None else contract_runs())

    return check


@_method_check
def check_deterministic(name: str, cls: type[Unlearner[Any]], runs: ContractRuns) -> None:
    """The same inputs give the same result, and the run directory is left untouched."""
    before = run_dir_digest(runs.all)
    with UnlearnSession(runs.all) as session:
        request = UnlearnRequest.of([0])
        a = session.run(cls(), request)
        b = session.run(cls(), request)
    assert torch.equal(a.params, b.params), f"{name}: two runs of one request differ"
    assert a.costs.client_epochs == b.costs.client_epochs, f"{name}: client epochs differ"
    assert a.details == b.details, f"{name}: details differ: {a.details} != {b.details}"
    assert run_dir_digest(runs.all) == before, f"{name} changed the run directory"


@_method_check
def check_forget_nobody(name: str, cls: type[Unlearner[Any]], runs: ContractRuns) -> None:
    """Forgetting nobody returns the original model, at no cost, with an exact lineage."""
    with UnlearnSession(runs.all) as session:
        result = session.run(cls(), UnlearnRequest.of([]))
        final = session.run_view.final_params
    assert torch.equal(result.params, final), f"{name}: not the run's final model"
    assert result.costs.client_epochs == 0, f"{name}: {result.costs.client_epochs} epochs"
    assert result.costs.history_bytes_read == 0, f"{name}: read {result.costs.history_bytes_read} B"
    assert result.lineage is not None, f"{name}: no lineage"
    assert result.lineage.exact, f"{name}: lineage {result.lineage.kind}"


@_method_check
def check_costs_and_details(name: str, cls: type[Unlearner[Any]], runs: ContractRuns) -> None:
    """Costs, typed details and a lineage from a declared start model are reported."""
    with UnlearnSession(runs.all) as session:
        result = session.run(cls(), UnlearnRequest.of([1]))
    costs = result.costs
    assert costs.wall_seconds >= 0, f"{name}: wall_seconds {costs.wall_seconds}"
    assert costs.history_bytes_read > 0, f"{name}: no history byte read"
    assert isinstance(result.details, Details), f"{name}: details {type(result.details)}"
    assert isinstance(result.details.to_dict(), dict), f"{name}: to_dict() is not a dict"
    lineage = result.lineage
    assert lineage is not None, f"{name}: no lineage"
    assert lineage.kind in ("exact", "approximate"), f"{name}: lineage kind {lineage.kind!r}"
    assert lineage.start_round is not None, f"{name} does not call context.start_from"
    # client 1 took part in the contract run
    assert lineage.first_tainted_round is not None, f"{name}: no first tainted round"
    if result.params.shape != session.run_view.final_params.shape:
        raise AssertionError(f"{name}: model shape {tuple(result.params.shape)}")
    if costs.client_epochs == 0:  # a method that trains nobody (``none``) reports no rounds
        return
    assert costs.rounds > 0, f"{name}: trained clients in {costs.rounds} rounds"
    assert costs.bytes_communicated > 0, f"{name}: trained clients, 0 bytes communicated"
    sent = costs.client_participations * 2 * result.params.numel() * 4
    assert sent == costs.bytes_communicated, f"{name}: {costs.bytes_communicated} B != {sent} B"
    rows = len(result.round_metrics)
    assert rows == costs.rounds, f"{name}: {rows} metric rows for {costs.rounds} rounds"


@_method_check
def check_unusable_history(name: str, cls: type[Unlearner[Any]], runs: ContractRuns) -> None:
    """A run without the history a method needs is refused before any work."""
    method = cls()
    request = UnlearnRequest.of([1])
    with _context(runs.none, request) as (session, context):
        shape = session.run_view.final_params.shape
        if method.required_policies is None:  # needs no client history: must work on it
            result = method.unlearn(request, context)
            assert result.params.shape == shape, f"{name}: model shape {result.params.shape}"
            assert bool(torch.isfinite(result.params).all()), f"{name}: non-finite model"
            return
        _refused_before_work(
            name,
            lambda: method.unlearn(request, context),
            context,
            (UnsupportedHistoryError, "needs history policy"),
            f"{name} ran on a run recorded with policy 'none'",
        )


@contextmanager
def _context(
    run_dir: Path, request: UnlearnRequest
) -> Iterator[tuple[UnlearnSession, UnlearnContext]]:
    """Open a session on ``run_dir`` and build ``request``'s context, as a method is given it."""
    with UnlearnSession(run_dir) as session:
        yield session, session.context(request)


def _refused_before_work(
    name: str,
    call: Callable[[], Any],
    context: UnlearnContext,
    refusal: tuple[type[Exception], str],
    accepted: str,
) -> None:
    """Assert that ``call`` raises ``refusal`` (type, words) with nothing trained or read."""
    error, words = refusal
    try:
        call()
    except error as err:
        assert words in str(err), f"{name}: {err}"
    else:
        raise AssertionError(accepted)
    assert context.meter.costs.client_epochs == 0, f"{name}: trained, then refused"
    assert context.meter.costs.history_bytes_read == 0, f"{name}: read, then refused"


def _out_of_bounds(metadata: Iterable[Any]) -> list[Any]:
    """Return values that violate a field's numeric bounds (``Field(ge=..., lt=...)``)."""
    bad: list[Any] = []
    for bound in metadata:
        if isinstance(bound, annotated_types.Ge):
            bad.append(cast(Any, bound.ge) - 1)
        elif isinstance(bound, annotated_types.Gt):
            bad.append(bound.gt)
        elif isinstance(bound, annotated_types.Le):
            bad.append(cast(Any, bound.le) + 1)
        elif isinstance(bound, annotated_types.Lt):
            bad.append(bound.lt)
    return bad


@_method_check
def check_invalid_params(name: str, cls: type[Unlearner[Any]], runs: ContractRuns) -> None:
    """Defaults build; an unknown key and each out-of-bounds value are refused at construction."""
    cls()  # the defaults are valid
    invalid: list[dict[str, Any]] = [{"no_such_parameter_of_any_method": 1}]
    for field_name, info in cls.params_type.model_fields.items():
        invalid += [{field_name: value} for value in _out_of_bounds(info.metadata)]
    for params in invalid:
        try:
            cls(params)
        except ConfigError as err:
            assert f"invalid parameters for method '{name}'" in str(err), f"{name}: {err}"
        else:
            raise AssertionError(f"{name} accepted invalid parameters {params}")


@_method_check
def check_declared_reads(name: str, cls: type[Unlearner[Any]], runs: ContractRuns) -> None:
    """The capability flags ``reads_round_models`` and ``reads_stored_rounds`` hold as read."""
    method = cls()
    request = UnlearnRequest.of([1])
    with _context(runs.all, request) as (_, context):
        method.unlearn(request, context)
        num_rounds = context.num_rounds
    log = context.read_log
    assert log is not None, f"{name}: the session's context logs no read"
    reads = log.reads
    if not cls.reads_stored_rounds:
        stored = [r for r in reads if r != Read(0, "global")]
        assert not stored, f"{name} declares reads_stored_rounds=False and read {stored[:5]}"
    if not cls.reads_round_models:
        models = [
            r for r in reads if r.kind != "update" and 0 < r.round < num_rounds
        ]  # M_0 and M_T are allowed
        assert not models, f"{name} declares reads_round_models=False and read {models[:5]}"


@_method_check
def check_sample_requests(name: str, cls: type[Unlearner[Any]], runs: ContractRuns) -> None:
    """A method that does not serve sample-level requests refuses one before any work."""
    if cls.serves_samples:
        return
    request = UnlearnRequest.of([], samples={1: [0, 1]})
    with _context(runs.all, request) as (_, context):
        _refused_before_work(
            name,
            lambda: cls().unlearn(request, context),
            context,
            (ConfigError, "removes whole clients only"),
            f"{name} declares serves_samples=False and served samples",
        )


#: Every check, in the order ``method_checks`` yields them.
CHECKS: tuple[Callable[[MethodSpec, ContractRuns | None], None], ...] = (
    check_invalid_params,
    check_forget_nobody,
    check_deterministic,
    check_costs_and_details,
    check_unusable_history,
    check_declared_reads,
    check_sample_requests,
)


def method_checks(method: MethodSpec) -> Iterator[tuple[str, Check]]:
    """Yield ``(check name, check)`` for ``method``; call ``check()`` or ``check(runs)``.

    Args:
        method: A registered method's name, or an ``Unlearner`` subclass.
    """
    for check in CHECKS:
        yield check.__name__, functools.partial(check, method)


def check_method(method: MethodSpec, runs: ContractRuns | None = None) -> None:
    """Run every check on ``method``; raise ``AssertionError`` naming the first that fails.

    Args:
        method: A registered method's name, or an ``Unlearner`` subclass.
        runs: The runs to check on (default: ``contract_runs()``, trained on first use).
    """
    for check_name, check in method_checks(method):
        try:
            check(runs)
        except Exception as err:
            raise AssertionError(f"{_resolve(method)[0]}: {check_name} failed: {err}") from err


def parametrize_with_checks(methods: Sequence[MethodSpec]) -> pytest.MarkDecorator:
    """Return a pytest decorator parametrizing a test over ``(method, check)`` pairs.

    The test receives ``method`` (as given) and ``check`` (bound to it) and calls ``check()``
    (or ``check(runs)`` with runs of its own, e.g. a session fixture's ``ContractRuns``)::

        @parametrize_with_checks(["retrain", MyMethod])
        def test_contract(method, check):
            check()

    Ids read ``<method>-<check name>``. pytest is imported here only: the library does not
    depend on it.
    """
    import pytest

    params = [(m, check) for m in methods for _, check in method_checks(m)]
    ids = [f"{_resolve(m)[0]}-{c.func.__name__}" for m, c in params]  # type: ignore[attr-defined]
    return pytest.mark.parametrize(("method", "check"), params, ids=ids)
