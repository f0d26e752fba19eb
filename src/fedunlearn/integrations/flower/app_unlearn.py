"""Unlearning over the user's own Flower app: a run ``Recording`` wrote, the same ClientApp.

``AppClients`` (``app_clients``) reaches the run's clients through the app's nodes.

``serve_request(grid, pending, evaluate_fn=...)`` (what ``Recording.start`` calls when there is
a request) opens the run with ``UnlearnSession`` (its data stays on the clients: the model comes
from the recorded factory, evaluation from the app's ``evaluate_fn`` in Flower's form ``(round,
ArrayRecord) -> MetricRecord``, its metric names mapped to fedunlearn's: ``accuracy``, ``acc``,
``test_acc`` -> ``test_accuracy``; ``loss`` -> ``test_loss``), runs a registered method
(Retrain, FedRecover, FedEraser, ``tv_exact``, ...) with its fresh client work going to the
remaining clients' nodes, and writes the result JSON and the model (``.safetensors``) next to the
run, logging each phase, each round and the result's path. Where the forgotten client's node is
reachable and its ClientApp computes losses, the result also holds the per-client check: the
client's mean loss on its own data under M_T and under the unlearned model (``client_check``);
a ClientApp without ``losses`` is never asked (``not provided``). The result's ``verification``
is the receipt of what the server can check (``app_receipt``).

``unlearn_over_app(grid, run_dir, method, forget)`` is the same for a caller that names the
request itself; ``unlearn_from_run_config(grid, context, ...)`` serves the run config's
``unlearn-*`` keys (``app_settings.REQUEST_KEYS``) and returns None when they name none.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from logging import INFO
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.common import log as flwr_log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from torch import nn

from fedunlearn.errors import HistoryError
from fedunlearn.history.store import HistoryStore
from fedunlearn.integrations.flower.app_clients import AppClients
from fedunlearn.integrations.flower.app_protocol import (
    ArrayLayout,
)
from fedunlearn.integrations.flower.app_receipt import app_verification
from fedunlearn.integrations.flower.app_settings import (
    REQUEST_KEYS,
    PendingRequest,
    request_from_run_config,
)
from fedunlearn.integrations.flower.driver import missing_json, source_metadata
from fedunlearn.models import get_flat_params, save_model
from fedunlearn.runs import HISTORY_DIR
from fedunlearn.runs.app_requests import APP_META, AppRequest, request_served
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

log = logging.getLogger(__name__)

EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]
__all__ = [
    "REQUEST_KEYS",
    "AppClients",
    "Served",
    "flower_evaluator",
    "serve_request",
    "unlearn_from_run_config",
    "unlearn_over_app",
]
# an evaluate_fn's metric names -> fedunlearn's (the receipt's utility check reads these)
METRIC_NAMES = {
    "accuracy": "test_accuracy",
    "acc": "test_accuracy",
    "test_acc": "test_accuracy",
    "eval_acc": "test_accuracy",
    "loss": "test_loss",
    "eval_loss": "test_loss",
}


def app_layout(run_dir: str | Path) -> tuple[ArrayLayout, dict[str, Any]]:
    """Return the array layout and app facts ``Recording`` kept in the run's store.

    Raises:
        HistoryError: the run was not recorded from a Flower app.
    """
    with HistoryStore.open(Path(run_dir) / HISTORY_DIR) as store:
        app = store.run_meta.flower_app
    if app is None:
        raise HistoryError(
            f"{run_dir} was not recorded from a Flower app (no '{APP_META}' in its store); "
            "unlearn it with 'fedunlearn unlearn' or fedunlearn's own ServerApp"
        )
    return ArrayLayout.from_meta(app["layout"]), app


def flower_evaluator(
    evaluate_fn: EvaluateFn, layout: ArrayLayout | None = None, accuracy_key: str | None = None
) -> Callable[[nn.Module], dict[str, float]]:
    """Return ``UnlearnSession``'s ``evaluator(module)`` of a Flower ``evaluate_fn``.

    The module's flat parameters go to ``evaluate_fn`` in the app's own arrays (``layout``;
    without it, the module's ``state_dict``). Its metrics are returned as it names them, and
    under fedunlearn's names (``METRIC_NAMES``; ``accuracy_key`` names the accuracy of an app
    that calls it otherwise), which the receipt's utility check reads.
    """

    def evaluator(module: nn.Module) -> dict[str, float]:
        arrays = (
            layout.record(get_flat_params(module))
            if layout is not None
            else ArrayRecord(module.state_dict())
        )
        return mapped_metrics(_scalar_metrics(evaluate_fn(0, arrays)), accuracy_key)

    return evaluator


def mapped_metrics(metrics: dict[str, float], accuracy_key: str | None = None) -> dict[str, float]:
    """Return ``metrics`` with fedunlearn's names added (``METRIC_NAMES``, ``accuracy_key``)."""
    names = dict(METRIC_NAMES)
    if accuracy_key:
        names[accuracy_key] = "test_accuracy"
    out = dict(metrics)
    for theirs, ours in names.items():
        if theirs in metrics and ours not in out:
            out[ours] = metrics[theirs]
    return out


def _scalar_metrics(record: MetricRecord | None) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in (record or {}).items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


@dataclass(frozen=True)
class Served:
    """A served request: the summary written, and the unlearned model as Flower's ``Result``."""

    summary: dict[str, Any]
    result: Result


def _phase(number: int, text: str, *args: Any) -> None:
    flwr_log(INFO, "fedunlearn: [%d/3] " + text, number, *args)


def serve_request(
    grid: Grid,
    pending: PendingRequest,
    *,
    evaluate_fn: EvaluateFn | None = None,
    accuracy_key: str | None = None,
    round_timeout: float = 600.0,
    node_timeout: float = 60.0,
) -> Served:
    """Serve one unlearning request over the app (module docstring); dequeue it when done.

    Returns:
        The summary written and the unlearned model (``Result.arrays``, the app's own keys;
        ``evaluate_metrics_serverapp[0]``: the app's evaluation of it).
    """
    request = pending.request
    _phase(
        1,
        "serving a request (%s): %s client(s) %s of the run %s with %s%s",
        pending.source,
        request.kind,
        list(request.forget),
        pending.run_dir,
        request.method,
        f"; {pending.waiting} more queued" if pending.waiting else "",
    )
    summary, params, layout = _unlearn(
        grid,
        pending.run_dir,
        request,
        evaluate_fn=evaluate_fn,
        accuracy_key=accuracy_key,
        round_timeout=round_timeout,
        node_timeout=node_timeout,
    )
    if pending.source == "queued":
        request_served(pending.run_dir)
    arrays = layout.record(params)
    result = Result(arrays=arrays)
    if evaluate_fn is not None:
        metrics = evaluate_fn(0, arrays)
        if metrics is not None:
            result.evaluate_metrics_serverapp[0] = metrics
    flwr_log(
        INFO,
        "fedunlearn: done: %s; result written to %s (model %s)",
        _verdicts(summary),
        summary["result_file"],
        summary["model_file"],
    )
    return Served(summary, result)


def _verdicts(summary: dict[str, Any]) -> str:
    receipt = summary["verification"]
    checks = {c["name"]: c for c in receipt["checks"]}
    shown = [f"influence {receipt['influence']}"]
    if "utility" in checks:
        shown.append(f"utility {checks['utility']['verdict']}")
    acc = summary.get("test_accuracy")
    if isinstance(acc, float):
        shown.append(f"test accuracy {acc:.4f}")
    return ", ".join(shown) or "no checks"


def _unlearn(
    grid: Grid,
    run_dir: str | Path,
    request: AppRequest,
    *,
    evaluate_fn: EvaluateFn | None,
    accuracy_key: str | None,
    round_timeout: float,
    node_timeout: float,
) -> tuple[dict[str, Any], torch.Tensor, ArrayLayout]:
    unlearner = make_method(request.method, request.params)
    wanted = UnlearnRequest.of(request.forget, request.kind)
    layout, app = app_layout(run_dir)
    key = accuracy_key or app.get("accuracy_key")
    evaluator = flower_evaluator(evaluate_fn, layout, key) if evaluate_fn is not None else None
    with UnlearnSession(run_dir, evaluator=evaluator, evaluate=evaluate_fn is not None) as session:
        run = session.run_view
        wanted = session.cumulative(wanted)  # and every client forgotten earlier
        clients = AppClients(
            grid,
            run,
            layout,
            weight_key=str(app.get("weight_key", "num-examples")),
            round_timeout=round_timeout,
            node_timeout=node_timeout,
            label=request.method,
        )
        _phase(2, "%s: fresh training on the remaining clients' nodes", request.method)
        result = unlearner.unlearn(wanted, session.context(wanted, clients=clients))
        _phase(
            3,
            "receipt: %s; the forgotten clients' own check",
            "utility by the app's evaluate_fn"
            if evaluate_fn is not None
            else "no evaluate_fn given to start(): utility not measured",
        )
        summary: dict[str, Any] = {
            "engine": "flower-app",
            "method": request.method,
            "request": session.request_summary(wanted),
            "params": unlearner.params.model_dump(mode="json"),
            **session.evaluation.evaluate(result.params),
            "costs": result.costs.to_dict(),
            "round_metrics": [dict(r) for r in result.round_metrics],
            "details": result.details.to_dict() if result.details is not None else None,
            "lineage": result.lineage.to_dict() if result.lineage else None,
            "missing": missing_json(clients.missing),
            "client_check": client_check(clients, wanted.forget, run.final_params, result.params),
        }
        receipt = app_verification(session, wanted, result, summary["client_check"])
        summary["verification"] = receipt.to_dict()
        target = Path(request.out) if request.out else run.run_dir / f"flower_{request.method}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        model_file = target.with_suffix(".safetensors")
        meta = source_metadata(
            run.run_dir, request.method, wanted.forget, request.kind, "flower-app"
        )
        if app.get("arrays_only"):  # the app's own keys: its model loads them
            state = layout.record(result.params).to_torch_state_dict()
            safetensors.torch.save_file(
                {k: v.contiguous() for k, v in state.items()}, model_file, meta
            )
        else:
            save_model(model_file, run.model, params=result.params, metadata=meta)
        summary["model_file"] = str(model_file)
        summary["result_file"] = str(target)
        target.write_text(json.dumps(summary, indent=2, default=str) + "\n")
        return summary, result.params, layout


def unlearn_over_app(
    grid: Grid,
    run_dir: str | Path,
    method: str,
    forget: Sequence[int],
    *,
    params: dict[str, Any] | None = None,
    kind: str = "forget",
    evaluate_fn: EvaluateFn | None = None,
    out: str | Path | None = None,
    round_timeout: float = 600.0,
    node_timeout: float = 60.0,
) -> dict[str, Any]:
    """Run ``method`` on a recorded Flower-app run, fresh client work over ``grid``.

    Args:
        grid: The ServerApp's Grid (the user's ClientApp on the nodes).
        run_dir: The run ``Recording`` wrote.
        method: A registered method name (``fedunlearn methods``).
        forget: Client ids to remove.
        params: The method's parameters.
        kind: ``forget`` or ``recover``.
        evaluate_fn: The user's server-side evaluation, ``(round, ArrayRecord) ->
            MetricRecord`` (Flower's ``evaluate_fn``); None: no server-side metrics.
        out: Result JSON path (default ``<run_dir>/flower_<method>.json``); the model goes
            next to it (``.safetensors``).
        round_timeout: Seconds to wait for one exchange's replies.
        node_timeout: Seconds to wait for a node per client to connect.

    Returns:
        The summary written (method, request, metrics, costs, missing clients, client check).
    """
    request = AppRequest(
        tuple(forget), method, dict(params or {}), kind, str(out) if out is not None else None
    )
    summary, _, _ = _unlearn(
        grid,
        run_dir,
        request,
        evaluate_fn=evaluate_fn,
        accuracy_key=None,
        round_timeout=round_timeout,
        node_timeout=node_timeout,
    )
    return summary


def client_check(
    clients: AppClients, forget: frozenset[int], before: torch.Tensor, after: torch.Tensor
) -> dict[str, Any]:
    """Each forgotten client's mean loss on its own data under M_T and the unlearned model.

    Computed on the client's node (``query.fedunlearn`` ``losses``); a client whose node is
    unreachable or computes no losses gets the reason instead (``shown: False``).
    """
    out: dict[str, Any] = {}
    for cid in sorted(forget):
        was = clients.client_losses(cid, before)
        now = clients.client_losses(cid, after) if not isinstance(was, str) else was
        if isinstance(was, str) or isinstance(now, str):
            out[str(cid)] = {"shown": False, "reason": was if isinstance(was, str) else now}
            continue
        out[str(cid)] = {
            "shown": True,
            "samples": int(len(was)),
            "loss_before": float(was.mean()),
            "loss_after": float(now.mean()),
            "loss_rise": float(now.mean() - was.mean()),
        }
    return out


def unlearn_from_run_config(
    grid: Grid, context: Context, *, evaluate_fn: EvaluateFn | None = None
) -> dict[str, Any] | None:
    """Serve an unlearning request named by the run config (``REQUEST_KEYS``), else None.

    In a ServerApp that does not wrap its strategy in ``Recording(strategy, context)`` (which
    serves requests itself): ``if unlearn_from_run_config(grid, context, evaluate_fn=...):
    return`` before training.

    Raises:
        ConfigError: a key has a value of the wrong form (named, with what is allowed).
    """
    pending = request_from_run_config(dict(context.run_config))
    if pending is None:
        return None
    return serve_request(grid, pending, evaluate_fn=evaluate_fn).summary
