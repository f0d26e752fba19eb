"""Unlearning over the user's own Flower app: a run ``Recording`` wrote, the same ClientApp.

``AppClients`` is the clients seam (``fedunlearn.fl.clients.RunClients``) over a Grid whose
SuperNodes run the user's ClientApp (``app_protocol.own_client_app``): ``train(task)`` finds the
node of each asked client (one ``query.fedunlearn`` to the nodes not placed yet), sends each a
plain ``train`` message (``"arrays"``: the start model in the run's keys and shapes;
``"config"``: ``lr``, ``local-epochs``, ``batch-size``, ``fedunlearn.client-id``,
``fedunlearn.round``, ``fedunlearn.seed``), checks the replies as ``Recording`` does and returns
the updates ``Δ_c = returned - start``. A client with no node, an error reply or a rejected
reply is left out and listed in ``missing[round]`` with the reason.

``unlearn_over_app(grid, run_dir, method, forget)`` opens the run with ``UnlearnSession`` (its
data stays on the clients: the model comes from the recorded factory, evaluation from the
user's ``evaluate_fn`` in Flower's form ``(round, ArrayRecord) -> MetricRecord``), runs a
registered method (Retrain, FedRecover, FedEraser, ...) with its fresh client work going to
the remaining clients' nodes, and writes the result JSON and the model (``.safetensors``) next
to the run. When the forgotten client's node is reachable and its ClientApp computes losses,
the result also holds the per-client check: the client's mean loss on its own data under M_T
and under the unlearned model (``client_check``); otherwise it says why not. The result's
``verification`` is the receipt of what the server can check (``app_receipt``).

``unlearn_from_run_config(grid, context, ...)`` is the one call a user's ServerApp makes to
serve unlearning requests: with the run config key ``unlearn-forget`` set it runs the request
(keys in ``REQUEST_KEYS``) and returns the summary, else None (train as usual).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from torch import nn

from fedunlearn.errors import ConfigError, HistoryError, UnknownClientError
from fedunlearn.fl.clients import TrainTask
from fedunlearn.fl.records import ClientUpdate
from fedunlearn.fl.seeding import derive_seed
from fedunlearn.integrations.flower.app_protocol import (
    CLIENT_ID,
    CONFIG_CLIENT,
    CONFIG_ROUND,
    CONFIG_SEED,
    QUERY_TYPE,
    RECORD,
    ArrayLayout,
    Reply,
    check_reply,
)
from fedunlearn.integrations.flower.app_receipt import app_verification
from fedunlearn.integrations.flower.recording import APP_META
from fedunlearn.models import save_model
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method
from fedunlearn.unlearn.views import RunView

log = logging.getLogger(__name__)

EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]
REQUEST_KEYS = {
    "unlearn-forget": 'client ids to forget, e.g. "1" or "1,4"; empty: no request (train)',
    "unlearn-run-dir": "absolute directory of the recorded run",
    "unlearn-method": "a registered method (retrain, fedrecover, federaser, ...); default retrain",
    "unlearn-params": "the method's parameters as JSON, e.g. '{\"rounds\": 3}'",
    "unlearn-out": "result JSON (default <run-dir>/flower_<method>.json)",
}


class AppClients:
    """The recorded run's clients, reached through ``grid`` and the user's ClientApp.

    Args:
        grid: The ServerApp's Grid.
        run: The run, opened (``RunView``).
        layout: The run's array layout (keys and shapes of the ClientApp's arrays).
        weight_key: The sample-count key of a reply's metrics.
        round_timeout: Seconds to wait for one exchange's replies.
        node_timeout: Seconds to wait for a node per client to connect.
    """

    def __init__(
        self,
        grid: Grid,
        run: RunView,
        layout: ArrayLayout,
        *,
        weight_key: str = "num-examples",
        round_timeout: float = 600.0,
        node_timeout: float = 60.0,
    ) -> None:
        self.grid = grid
        self.layout = layout
        self.spec = run.spec
        self.seed = run.config.seed
        self.model = run.model
        self.num_params = layout.size
        self.weight_key = weight_key
        self.round_timeout = round_timeout
        self.node_timeout = node_timeout
        self._sizes = dict(run.client_sizes)
        self._nodes: dict[int, int] = {}
        self._asked_nodes: set[int] = set()
        self.missing: dict[int, dict[int, str]] = {}

    @property
    def client_ids(self) -> tuple[int, ...]:
        """Every client of the run, sorted."""
        return tuple(sorted(self._sizes))

    def num_samples(self, client_id: int) -> int:
        """n_c as the client reported it during training."""
        if client_id not in self._sizes:
            raise UnknownClientError(f"client {client_id} is not in this run")
        return self._sizes[client_id]

    def node_of(self, client_id: int) -> int | None:
        """Return the node hosting ``client_id``, or None if none says so within ``node_timeout``.

        Nodes not asked yet get one ``query.fedunlearn`` (which clients do you host?); while
        ``client_id`` is unplaced, newly connected nodes are asked until ``node_timeout``.
        """
        deadline = time.monotonic() + self.node_timeout
        while client_id not in self._nodes:
            fresh = sorted(set(self.grid.get_node_ids()) - self._asked_nodes)
            if fresh:
                self._ask(fresh)
            elif time.monotonic() > deadline:
                return None
            else:
                time.sleep(0.5)
        return self._nodes[client_id]

    def _ask(self, nodes: Sequence[int]) -> None:
        """Ask ``nodes`` which clients they host."""
        self._asked_nodes |= set(nodes)
        query = [
            Message(
                RecordDict({RECORD: ConfigRecord({"want": "client-ids"})}),
                dst_node_id=n,
                message_type=QUERY_TYPE,
            )
            for n in nodes
        ]
        for reply in self.grid.send_and_receive(query, timeout=self.round_timeout):
            node = int(reply.metadata.src_node_id)
            if reply.has_error():
                log.warning(
                    "node %d did not say which clients it hosts (is its ClientApp built with "
                    "own_client_app?): %s",
                    node,
                    reply.error.reason.strip()[-200:],
                )
                continue
            for cid in reply.content[RECORD]["client-ids"]:  # type: ignore[union-attr]
                self._nodes.setdefault(int(cid), node)

    def mark_missing(self, round_: int, client_id: int, reason: str) -> None:
        """Record that ``client_id`` did not contribute to ``round_``, and why."""
        log.warning("round %d: client %d is missing: %s", round_, client_id, reason)
        self.missing.setdefault(round_, {})[client_id] = reason

    def train(self, task: TrainTask) -> list[ClientUpdate]:
        """Ask ``task.client_ids`` to train from ``task.global_params`` (``Clients.train``)."""
        spec = task.local_spec(self.spec)
        arrays = self.layout.record(task.global_params)
        messages = []
        for cid in task.client_ids:
            node = self.node_of(cid)
            if node is None:
                self.mark_missing(task.round, cid, "no connected node hosts this client")
                continue
            config = ConfigRecord(
                {
                    "lr": float(spec.lr),
                    "local-epochs": int(spec.epochs),
                    "batch-size": int(spec.batch_size),
                    CONFIG_CLIENT: int(cid),
                    CONFIG_ROUND: int(task.round),
                    CONFIG_SEED: derive_seed(self.seed, "client", task.round, cid, task.salt),
                }
            )
            messages.append(
                Message(
                    RecordDict({"arrays": arrays, "config": config}),
                    dst_node_id=node,
                    message_type="train",
                    group_id=str(task.round),
                )
            )
        got: dict[int, Reply] = {}
        for reply in self.grid.send_and_receive(messages, timeout=self.round_timeout):
            if reply.has_error():
                node = int(reply.metadata.src_node_id)
                for cid in [c for c, n in self._nodes.items() if n == node]:
                    if cid in task.client_ids:
                        why = reply.error.reason.strip()[-200:]
                        self.mark_missing(task.round, cid, f"client error: ...{why}")
                continue
            cid, out = check_reply(reply, self.layout, weight_key=self.weight_key)
            if isinstance(out, str) or out.client_id not in task.client_ids:
                why = out if isinstance(out, str) else f"client {cid} was not asked"
                log.warning("round %d: rejected reply: %s", task.round, why)
                if cid is not None and cid in task.client_ids:
                    self.mark_missing(task.round, cid, f"rejected: {why}")
                continue
            got.setdefault(out.client_id, out)
        for cid in task.client_ids:
            if cid not in got and cid not in self.missing.get(task.round, {}):
                self.mark_missing(task.round, cid, f"no reply within {self.round_timeout:g} s")
        start = task.global_params.detach().to(torch.float32).cpu()
        return [
            ClientUpdate(c, got[c].params - start, got[c].num_samples, got[c].loss or 0.0)
            for c in task.client_ids
            if c in got
        ]

    def client_losses(self, client_id: int, params: torch.Tensor) -> np.ndarray | str:
        """Return ``client_id``'s per-sample losses on its own data under ``params``, or why not."""
        node = self.node_of(client_id)
        if node is None:
            return "not shown: the forgotten client's data is on its node, and no node hosts it now"
        message = Message(
            RecordDict(
                {
                    "arrays": self.layout.record(params),
                    RECORD: ConfigRecord({"want": "losses", CLIENT_ID: int(client_id)}),
                }
            ),
            dst_node_id=node,
            message_type=QUERY_TYPE,
        )
        replies = list(self.grid.send_and_receive([message], timeout=self.round_timeout))
        if not replies:
            return "not shown: the forgotten client's data is on its node, which did not reply"
        if replies[0].has_error():
            why = replies[0].error.reason.strip().splitlines()[-1][-200:]
            return f"not shown: the forgotten client's data is on its node, which says: {why}"
        (values,) = replies[0].content["losses"].to_numpy_ndarrays()
        return np.asarray(values, dtype=np.float64)

    def close(self) -> None:
        """Nothing to release (the Grid belongs to Flower)."""


def app_layout(session: UnlearnSession) -> tuple[ArrayLayout, dict[str, Any]]:
    """Return the array layout and app facts ``Recording`` kept in the run's store.

    Raises:
        HistoryError: the run was not recorded from a Flower app.
    """
    app = session.run_view.store.meta.get(APP_META)
    if app is None:
        raise HistoryError(
            f"{session.run_view.run_dir} was not recorded from a Flower app (no '{APP_META}' in "
            "its store); unlearn it with 'fedunlearn unlearn' or fedunlearn's own ServerApp"
        )
    return ArrayLayout.from_meta(app["layout"]), app


def flower_evaluator(evaluate_fn: EvaluateFn) -> Callable[[nn.Module], dict[str, float]]:
    """Return ``UnlearnSession``'s ``evaluator(module)`` of a Flower ``evaluate_fn``."""

    def evaluator(module: nn.Module) -> dict[str, float]:
        return _scalar_metrics(evaluate_fn(0, ArrayRecord(module.state_dict())))

    return evaluator


def _scalar_metrics(record: MetricRecord | None) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in (record or {}).items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


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
    unlearner = make_method(method, params or {})
    request = UnlearnRequest.of(tuple(int(c) for c in forget), kind)
    evaluator = flower_evaluator(evaluate_fn) if evaluate_fn is not None else None
    with UnlearnSession(run_dir, evaluator=evaluator, evaluate=evaluate_fn is not None) as session:
        layout, app = app_layout(session)
        run = session.run_view
        request = session.cumulative(request)  # and every client forgotten earlier
        clients = AppClients(
            grid,
            run,
            layout,
            weight_key=str(app.get("weight_key", "num-examples")),
            round_timeout=round_timeout,
            node_timeout=node_timeout,
        )
        result = unlearner.unlearn(request, session.context(request, clients=clients))
        summary: dict[str, Any] = {
            "engine": "flower-app",
            "method": method,
            "request": session.request_summary(request),
            "params": unlearner.params.model_dump(mode="json"),
            **session.evaluation.evaluate(result.params),
            "costs": result.costs.to_dict(),
            "round_metrics": [dict(r) for r in result.round_metrics],
            "missing": {
                str(r): {str(c): why for c, why in sorted(m.items())}
                for r, m in sorted(clients.missing.items())
            },
            "client_check": client_check(clients, request.forget, run.final_params, result.params),
        }
        receipt = app_verification(session, request, result, summary["client_check"])
        summary["verification"] = receipt.to_dict()
        target = Path(out) if out else run.run_dir / f"flower_{method}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        model_file = target.with_suffix(".safetensors")
        source = {
            "run": str(run.run_dir),
            "method": method,
            "forget": sorted(request.forget),
            "kind": kind,
            "engine": "flower-app",
        }
        save_model(
            model_file,
            run.model,
            params=result.params,
            metadata={"fedunlearn.source": json.dumps(source, sort_keys=True)},
        )
        summary["model_file"] = str(model_file)
        target.write_text(json.dumps(summary, indent=2, default=str) + "\n")
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

    In the user's ServerApp: ``if unlearn_from_run_config(grid, context, evaluate_fn=...):
    return`` before training.

    Raises:
        ConfigError: a key has a value of the wrong form (named, with what is allowed).
    """
    rc = context.run_config

    def text(key: str) -> str:
        return str(rc.get(key, "") or "").strip()

    if not text("unlearn-forget"):
        return None
    try:
        forget = [int(c) for c in text("unlearn-forget").split(",") if c.strip()]
    except ValueError:
        raise ConfigError(
            f'unlearn-forget takes comma-separated client ids, e.g. "1,4"; got '
            f"{text('unlearn-forget')!r}"
        ) from None
    if not text("unlearn-run-dir") or not Path(text("unlearn-run-dir")).is_absolute():
        raise ConfigError("unlearn-run-dir must be the recorded run's absolute directory")
    try:
        params = json.loads(text("unlearn-params") or "{}")
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"unlearn-params must be a JSON object; got {text('unlearn-params')!r} ({err})"
        ) from None
    return unlearn_over_app(
        grid,
        text("unlearn-run-dir"),
        text("unlearn-method") or "retrain",
        forget,
        params=params,
        evaluate_fn=evaluate_fn,
        out=text("unlearn-out") or None,
    )
