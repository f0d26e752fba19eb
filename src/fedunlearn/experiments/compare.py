"""Run unlearning methods on one finished run, judge them and issue each one's receipt.

``compare_methods`` runs the requested methods plus the no-unlearning control (``none``) and the
reference (``retrain``) on one request, scores each with ``fedunlearn.eval.judge.Judge``, verifies
each (``fedunlearn.eval.Verifier``, with Retrain as reference) and returns the ``results.json``
document (``docs/results_format.md``); ``unlearn_one`` runs one method and returns its verified
result with a JSON summary. Rendering (tables, plots) is ``fedunlearn.report``'s job.

Progress: pass an object with ``on_step(text)``, ``on_method(name, index, total)`` and
``on_round(name, metrics)`` (``Progress``); the CLI draws it.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import torch

import fedunlearn
from fedunlearn.config import RunConfig
from fedunlearn.eval.generations import client_entries
from fedunlearn.eval.judge import Judge, finite_or_none
from fedunlearn.eval.plan import ReceiptOptions, Receipts, open_receipts
from fedunlearn.eval.references import clean_path
from fedunlearn.history.store import HistoryStore
from fedunlearn.privacy.guarantees import result_privacy
from fedunlearn.privacy.releases import method_release
from fedunlearn.runs import run_privacy
from fedunlearn.unlearn import UnlearnRequest, UnlearnResult, UnlearnSession, make_method

__all__ = ["RESULTS_SCHEMA_VERSION", "Progress", "add_savings", "compare_methods", "unlearn_one"]

# 2: MIA figures attack the forgotten clients' clean data (1: the poisoned copies); every row
# carries a ``verification`` block and ``distance_to_original``.
RESULTS_SCHEMA_VERSION = 2


class Progress(Protocol):
    """What a comparison or an unlearning run reports while it works."""

    def on_step(self, text: str) -> None:
        """A stage without rounds starts (loading, fitting the attacks, verifying)."""

    def on_method(self, name: str, index: int, total: int) -> None:
        """Method ``index`` (1-based) of ``total`` starts."""

    def on_round(self, name: str, metrics: dict[str, float]) -> None:
        """Method ``name`` finished one unlearning round with these test metrics."""


def _ordered(methods: Sequence[str]) -> list[str]:
    names = list(dict.fromkeys(methods))
    for required, pos in (("retrain", 0), ("none", 0)):
        if required not in names:
            names.insert(pos, required)
    names.sort(key=lambda n: (n != "none", n != "retrain"))  # control, reference, then the rest
    return names


def _run(
    session: UnlearnSession,
    method: Any,
    request: UnlearnRequest,
    progress: Progress | None,
    index: int,
    total: int,
) -> UnlearnResult:
    if progress is None:
        return session.run(method, request)
    progress.on_method(method.name, index, total)
    return session.run(method, request, progress=_round_progress(progress, method.name))


def _round_progress(
    progress: Progress | None, name: str
) -> Callable[[dict[str, float]], None] | None:
    """Return the per-round callback that tells ``progress`` about method ``name``'s rounds."""
    if progress is None:
        return None
    return lambda metrics: progress.on_round(name, metrics)


def verifying_receipts(
    session: UnlearnSession,
    request: UnlearnRequest,
    options: ReceiptOptions,
    exact: bool,
    progress: Progress | None,
    retrain_index: tuple[int, int],
) -> Receipts:
    """``open_receipts`` for one model, telling ``progress`` of Retrain and of the verifying.

    Retrain is announced as method ``retrain_index`` (index, total) when it will be trained
    (a Retrain reference of a result that is not exact by lineage).
    """
    if progress is not None and options.reference == "retrain" and not exact:
        progress.on_method("retrain", *retrain_index)
    receipts = open_receipts(
        session,
        request,
        options,
        exact=exact,
        progress=_round_progress(progress, "retrain"),
        step=progress.on_step if progress is not None else None,
    )
    if progress is not None:
        progress.on_step("verifying")
    return receipts


def _jsonable_rounds(result: UnlearnResult) -> list[dict[str, Any]]:
    return [{k: finite_or_none(v) for k, v in r.items()} for r in result.round_metrics]


def _ratio(reference: float | None, value: float | None) -> float | None:
    if reference is None or not value:
        return None
    return reference / value


SAVINGS = (("epoch_saving_vs_retrain", "client_epochs"), ("time_saving_vs_retrain", "wall_seconds"))


def savings(retrain: Mapping[str, Any] | None, costs: Mapping[str, Any]) -> dict[str, float | None]:
    """Return ``costs``' saving against ``retrain``'s, both measures (``add_savings``)."""
    return {
        key: _ratio(None if retrain is None else retrain.get(measure), costs.get(measure))
        for key, measure in SAVINGS
    }


def add_savings(rows: Sequence[dict[str, Any]]) -> None:
    """Set each row's saving against the Retrain row of the same comparison, both measures.

    ``epoch_saving_vs_retrain``: Retrain's client epochs / the row's; ``time_saving_vs_retrain``:
    Retrain's method wall time / the row's (``wall_seconds``, the method's own: evaluation and
    receipt excluded). None (shown n/a) without a Retrain row, for the ``none`` control (it
    does no unlearning) and for a row with no epochs or no time.
    """
    retrain = next((r for r in rows if r["method"] == "retrain"), None)
    for row in rows:
        row.update(savings(None if row["method"] == "none" else retrain, row))


def compare_methods(
    run_dir: str | Path,
    forget: Sequence[int],
    methods: Sequence[str],
    *,
    params: dict[str, dict[str, Any]] | None = None,
    kind: str = "forget",
    receipt: ReceiptOptions | None = None,
    progress: Progress | None = None,
    evaluate_rounds: bool = True,
) -> dict[str, Any]:
    """Run ``methods`` (plus ``none`` and ``retrain``) on a run and return the results document.

    Args:
        run_dir: A finished run directory.
        forget: Client ids to remove.
        methods: Registered method names.
        params: Per-method hyperparameters, ``{"federaser": {"calibration_ratio": 1.0}}``.
        kind: ``forget`` or ``recover``.
        receipt: How the receipts are issued (``eval.plan.ReceiptOptions``: thresholds, the
            client-level test, the distance band, the seed of the evaluation's shadow models
            and MIA split); defaults if None. The reference is always Retrain.
        progress: Told about each stage, method and unlearning round.
        evaluate_rounds: Evaluate each method's model after every unlearning round (round
            metrics and progress); False evaluates the results only (at M = 1,000 with the CNN
            the per-round test pass costs more than the rounds' training).

    Returns:
        The ``results.json`` document (see ``docs/results_format.md``); every method row has a
        ``verification`` block.
    """
    options = replace(receipt or ReceiptOptions(), reference="retrain")
    params = params or {}
    names = _ordered(methods)
    unlearners = {n: make_method(n, params.get(n)) for n in names}  # validate before work
    request = UnlearnRequest.of(forget, kind)
    started = time.perf_counter()
    with UnlearnSession(run_dir, evaluate=evaluate_rounds) as session:
        run = session.run_view
        request = session.cumulative(request)  # every client forgotten earlier, too
        run.check_request(request)
        for method in unlearners.values():  # unsupported history fails before any work
            method.check_history(session.context(request))
        if progress is not None:
            progress.on_step("fitting the membership attacks")
        judge = Judge(run, session.evaluation, request, options.seed)
        results: dict[str, UnlearnResult] = {}
        order = ["retrain", *[n for n in names if n != "retrain"]]
        retrain_path: dict[str, torch.Tensor] = {}
        for index, name in enumerate(order, start=1):
            result = _run(session, unlearners[name], request, progress, index, len(order))
            if name == "retrain":  # the receipt's clean, less trained controls: 6 models
                retrain_path = clean_path(result)
            # a comparison applies nothing: drop the trajectory, (2 + n_t) d floats per round
            # (docs/lifecycle.md), rather than hold one per method until the end
            results[name] = replace(result, trajectory=None)
            del result  # else it holds this trajectory while the next method builds its own
        if progress is not None:
            progress.on_step("verifying")
        if options.client_test and progress is not None:
            progress.on_step("fitting the client-level membership test")
        receipts = open_receipts(
            session,
            request,
            options,
            retrain=results["retrain"],
            retrain_path=retrain_path,
            judge=judge,
            step=progress.on_step if progress is not None else None,
        )
        verifier = receipts.verifier
        rows = []
        for name in names:
            result = results[name]
            began = time.perf_counter()
            row = judge.judge(result, verifier.retrain_params)
            measured = time.perf_counter() - began
            row["stored_bytes"] = unlearners[name].history_bytes_needed(session.context(request))
            row["params"] = unlearners[name].params.model_dump(mode="json")
            row["round_metrics"] = _jsonable_rounds(result)
            row["details"] = result.details.to_dict()
            variant = result.claims().variant
            if variant is not None:  # e.g. fedadp on a run trained without DP
                row["label"] = f"{name} ({variant})"
            row["lineage"] = result.lineage.to_dict() if result.lineage is not None else None
            issued = receipts.receipt(row, result, shared_by=len(names), measured_seconds=measured)
            row["verification"] = issued.to_dict()
            rows.append(row)
        add_savings(rows)
        config = run.config.model_dump(mode="json")
        session_request = session.request_summary(request)
        malicious = sorted(run.malicious)
        privacy = run_privacy(run.config, run.store)
    return {
        "schema_version": RESULTS_SCHEMA_VERSION,
        "fedunlearn_version": fedunlearn.__version__,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "run_dir": str(run_dir),
        "request": session_request,
        "malicious_clients": malicious,
        "wall_seconds": time.perf_counter() - started,
        "methods": rows,
        "config": config,
        "privacy": {k: v for k, v in privacy.items() if k != "rounds"},
    }


def result_privacy_of(
    config: RunConfig, store: HistoryStore, method: str, params: Any
) -> dict[str, Any]:
    """The result's ``privacy``: the run's ledger, this model's status, every statistic's.

    The model's status is derived as ``fedunlearn apply`` derives it: from the method and its
    parameters (``fedunlearn.privacy.releases``), so a result states one status per artefact.
    """
    release = method_release(method, params.model_dump(mode="json"), config)
    reason = (
        release.reason
        if release is not None
        else f"{method} with these parameters trains its fresh updates without the run's DP "
        "mechanism: the unlearned model is not DP"
    )
    return result_privacy(
        run_privacy(config, store), released_dp=release is not None, reason=reason
    )


def unlearn_one(
    run_dir: str | Path,
    forget: Sequence[int],
    method: str,
    *,
    params: dict[str, Any] | None = None,
    kind: str = "forget",
    verify: bool = True,
    receipt: ReceiptOptions | None = None,
    progress: Progress | None = None,
    samples: Mapping[int, Sequence[int]] | None = None,
    evaluate_rounds: bool = True,
) -> tuple[UnlearnResult, dict[str, Any]]:
    """Run one method and return its result (verified) with a JSON summary.

    Args:
        run_dir: A finished run directory.
        forget: Client ids to remove.
        method: Registered method name.
        params: The method's hyperparameters.
        kind: ``forget`` or ``recover``.
        verify: Attach the receipt (``result.verification``, ``summary["verification"]``).
        receipt: How the receipt is issued (``eval.plan.ReceiptOptions``: the reference,
            ``original`` (cheap; the distance check is n/a) or ``retrain`` (also run Retrain and
            judge against it), the thresholds, the client-level test, the distance band, the
            seed of the membership attacks); defaults if None. Unused without ``verify``.
        progress: Told about each stage, method and unlearning round.
        samples: Client -> sample ids to delete (a sample-level request).
        evaluate_rounds: Evaluate the model after every unlearning round (round metrics and
            progress); False evaluates the result only (a benchmark's wall time is the method's).
    """
    options = receipt or ReceiptOptions()
    reference = options.reference
    unlearner = make_method(method, params)
    request = UnlearnRequest.of(forget, kind, samples)
    with UnlearnSession(run_dir, evaluate=evaluate_rounds) as session:
        run = session.run_view
        request = session.cumulative(request)  # every client forgotten earlier, too
        run.check_request(request)
        unlearner.check_history(session.context(request))
        total = 2 if verify and reference == "retrain" else 1
        result = _run(session, unlearner, request, progress, 1, total)
        quality = session.evaluation.evaluate(result.params)
        summary: dict[str, Any] = {
            "schema_version": RESULTS_SCHEMA_VERSION,
            "method": method,
            "request": session.request_summary(request),
            "run": session.identity(),
            "params": unlearner.params.model_dump(mode="json"),
            **{k: finite_or_none(v) for k, v in quality.items()},
            "stored_bytes": unlearner.history_bytes_needed(session.context(request)),
            "costs": result.costs.to_dict(),
            "round_metrics": _jsonable_rounds(result),
            "details": result.details.to_dict(),
            "lineage": result.lineage.to_dict() if result.lineage is not None else None,
            "privacy": result_privacy_of(run.config, run.store, method, unlearner.params),
            "torch_threads": torch.get_num_threads(),  # the run's own (fl/threads.py)
        }
        if verify:
            exact = result.lineage is not None and result.lineage.exact
            receipts = verifying_receipts(session, request, options, exact, progress, (2, 2))
            verifier = receipts.verifier
            result = receipts.verify(result)
            if result.verification is not None:
                summary["verification"] = result.verification.to_dict()
                # one entry per forgotten client, new and earlier (a living run: eval.generations)
                summary["verification"]["clients"] = client_entries(
                    run,
                    result.verification,
                    verifier.deletion,
                    request.forget,
                    history_bytes_read=result.costs.history_bytes_read,
                )
            if verifier.retrain is not None and verifier.retrain_row is not None:
                retrain = {
                    "test_accuracy": verifier.retrain_row["test_accuracy"],
                    "backdoor_asr": verifier.retrain_row["backdoor_asr"],
                    "client_epochs": verifier.retrain.costs.client_epochs,
                    "wall_seconds": verifier.retrain.costs.wall_seconds,  # method time only
                }
                # the method's saving, both measures, as compare's rows carry it
                summary["retrain"] = {**retrain, **savings(retrain, summary["costs"])}
        session.check_unchanged()  # the receipt read the store too
    return result, summary
