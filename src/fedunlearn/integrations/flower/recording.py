"""``Recording``: any Flower Message-API ``Strategy``, every round kept in fedunlearn's history.

In the user's own ServerApp, one changed line (and the import)::

    strategy = Recording(FedAvg(fraction_evaluate=0.5), context)
    result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=3, ...)

``Recording.start`` runs Flower's own loop (``Strategy.start``) and the wrapped strategy decides
everything it decides alone (sampling, aggregation, client evaluation). Around it the wrapper
writes a normal fedunlearn run directory (``config.yaml``, ``history/``, ``metrics.jsonl``,
``summary.json``) that ``fedunlearn info``, ``verify`` and ``forget`` read like any other:

- round 0: M_0 (the initial arrays), with the server-side evaluation of round 0;
- each round t: M_t (the strategy's aggregate arrays), the aggregate ``M_t - M_{t-1}``, each
  accepted client's update ``Δ_c = (its returned arrays) - M_{t-1}`` as a flat float32 vector
  (``app_protocol.ArrayLayout``), its sample count (``num-examples``, the key FedAvg weighs
  by) and loss, the rejected and missing clients with the reason, and the round's metrics
  (the strategy's aggregated train metrics, the ``evaluate_fn`` results, Flower's federated
  evaluation prefixed ``federated_``);
- the stored config: ``data.dataset: node-local`` (the server never loads the clients' data),
  ``model.factory`` (``app_model.resolve_model``: the model given, else the app's model class
  whose arrays match, else the arrays alone) and the local training settings fresh unlearning
  work reuses (``app_settings.resolve_training``: found where the app keeps them, refused in
  one line when the local work is unknown).

The same ``start`` serves an unlearning request instead of training when there is one
(``app_settings.pending_request``: the run config's ``unlearn-*`` keys, or a request
``fedunlearn unlearn`` queued in one of the app's runs): ``app_unlearn.serve_request`` runs the
method with the app's clients and its ``evaluate_fn``, and ``start`` returns the unlearned
model as Flower's ``Result``.

With ``sampling = "tv_stable"`` (a keyword or the run config key) the rounds are FATS's
deletion-ready rounds (``app_sampling``): the wrapper draws the clients and aggregates by
multiplicity; the strategy aggregates the metrics and runs the federated evaluation.

Client ids are the stable ids a reply carries (``app_protocol``: the node config's
``partition-id`` by default), never Flower's node ids. A reply that names no client, repeats a
client of the round, holds non-finite or huge values, the wrong keys or shapes, or no sample
count, is left out of what the strategy aggregates, logged in one line and recorded (a
``rejected`` client record, or the round scalar ``rejected_replies``); the round goes on as the
strategy would with the other replies.

Recording policies: ``all``, ``every`` (updates of every k-th round) and ``none``; the policies
that read the clients' data on the server (Crab's, FedADP's) cannot run here.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from logging import INFO
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.common import log as flwr_log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from torch import nn

from fedunlearn.config import HistoryConfig, RunConfig, dump_config
from fedunlearn.errors import ConfigError
from fedunlearn.history.policy import (
    PolicyEnv,
    build_policy,
)
from fedunlearn.history.store import HistoryStore
from fedunlearn.integrations.flower.app_model import (
    ModelChoice,
    app_namespaces,
    model_layout,
    resolve_model,
)
from fedunlearn.integrations.flower.app_protocol import (
    CONFIG_ROUND,
    CONFIG_RUN_SEED,
    DEFAULT_MAX_ABS,
    DEFAULT_WEIGHT_KEY,
    ArrayLayout,
)
from fedunlearn.integrations.flower.app_rounds import (
    AppRound,
    numbers,
    sort_replies,
    write_round,
)
from fedunlearn.integrations.flower.app_sampling import (
    TvRounds,
    tv_rounds,
    weigh_by_multiplicity,
)
from fedunlearn.integrations.flower.app_settings import (
    TrainSettings,
    pending_request,
    recorded_config,
    resolve_training,
)
from fedunlearn.runs import (
    CONFIG_FILE,
    HISTORY_DIR,
    METRICS_FILE,
    SUMMARY_FILE,
)
from fedunlearn.runs.app_requests import APP_META
from fedunlearn.runs.rundir import write_json
from fedunlearn.runs.setup import aggregator_of
from fedunlearn.runs.user import user_model

log = logging.getLogger(__name__)

POLICIES = ("all", "every", "none")


def app_name(caller: Mapping[str, Any]) -> str:
    """Return the app's name: the top-level package of the ServerApp's module."""
    name = str(caller.get("__name__", "") or "").split(".")[0]
    return name if name and name != "__main__" else "flower-app"


class Recording(Strategy):
    """A Message-API strategy whose rounds are recorded into a fedunlearn run directory.

    Every argument but ``strategy`` is optional (``app_settings``: where each setting is
    looked up when not given).

    Args:
        strategy: The wrapped strategy (``FedAvg(...)``, any ``Strategy``).
        context: The ServerApp's ``Context``: its run config holds the app's settings (and a
            request to serve), its run id names the default run directory.
        run_dir: The run directory to create (must not hold a run).
        model: The model: a zero-argument ``nn.Module`` class (Flower's ``Net``), a factory
            ``function(input_shape, num_classes, **model_options)`` or its import path
            ``"pkg.module:function"``; default: the app's class whose arrays match
            (``app_model``), else the arrays alone.
        input_shape: Shape of one example (needed only by a factory that takes it).
        num_classes: Number of classes (default: the last one-dimensional array's length).
        model_options: Keyword options of the factory.
        policy: Recording policy: ``all``, ``every`` or ``none``.
        every: With ``every``: keep the updates of every k-th round.
        num_clients: Number of clients (default: the connected nodes at the start, or more
            when replies name higher ids).
        seed: The run seed (recorded; clients and fresh unlearning work derive seeds from it).
        weight_key: The sample-count key of a reply's metrics (default: the strategy's
            ``weighted_by_key``, else ``num-examples``).
        max_abs: Replies holding a value above this (in absolute value) are rejected.
        lr: Learning rate recorded for fresh unlearning work.
        local_epochs: Local epochs the clients train (recorded; fresh work asks the same).
        batch_size: Batch size recorded (the ClientApp batches its own data).
        sampling: ``tv_stable`` for deletion-ready rounds (``app_sampling``).
        local_steps: ``tv_stable``: local mini-batch steps per round.
        accuracy_key: The ``evaluate_fn`` metric that is the test accuracy, when it is named
            other than ``accuracy``, ``acc``, ``test_accuracy`` or ``test_acc``.
        node_timeout: Seconds to wait for nodes to connect (``tv_stable`` and unlearning).
    """

    def __init__(  # noqa: PLR0913 - every setting has a default looked up in the app
        self,
        strategy: Strategy,
        context: Context | None = None,
        *,
        run_dir: str | Path | None = None,
        model: str | Callable[..., nn.Module] | None = None,
        input_shape: tuple[int, ...] | None = None,
        num_classes: int | None = None,
        model_options: dict[str, Any] | None = None,
        policy: str = "all",
        every: int = 5,
        num_clients: int | None = None,
        seed: int | None = None,
        weight_key: str | None = None,
        max_abs: float = DEFAULT_MAX_ABS,
        lr: float | None = None,
        local_epochs: int | None = None,
        batch_size: int | None = None,
        sampling: str | None = None,
        local_steps: int | None = None,
        accuracy_key: str | None = None,
        node_timeout: float = 60.0,
    ) -> None:
        if policy not in POLICIES:
            raise ConfigError(
                f"Recording policy {policy!r}: a Flower app with node-local data records with "
                f"{', '.join(POLICIES)} (policies that read the clients' data on the server "
                "cannot run here)"
            )
        self.strategy = strategy
        self.context = context
        self.model = model
        self.input_shape = None if input_shape is None else tuple(int(s) for s in input_shape)
        self.num_classes = num_classes
        self.model_options = dict(model_options or {})
        self.history = HistoryConfig(policy=policy, every=every)
        self.num_clients = num_clients
        self.weight_key: str = (
            weight_key or getattr(strategy, "weighted_by_key", None) or DEFAULT_WEIGHT_KEY
        )
        self.max_abs = float(max_abs)
        self.accuracy_key = accuracy_key
        self.node_timeout = float(node_timeout)
        self._given: dict[str, Any] = {
            "run_dir": None if run_dir is None else str(run_dir),
            "lr": lr,
            "local_epochs": local_epochs,
            "batch_size": batch_size,
            "seed": seed,
            "sampling": sampling,
            "local_steps": local_steps,
        }
        self.settings: TrainSettings | None = None
        self.run_dir: Path | None = Path(run_dir) if run_dir is not None else None
        self.recording_seconds: list[float] = []  # the wrapper's own time per round
        self.store: HistoryStore | None = None
        self.layout: ArrayLayout | None = None
        self.choice: ModelChoice | None = None
        self.served: dict[str, Any] | None = None  # a request served instead of training
        self._policy: Any = None
        self._pending: AppRound | None = None
        self._before: torch.Tensor | None = None
        self._asked: set[int] = set()
        self._node_clients: dict[int, set[int]] = {}
        self._sizes: dict[int, int] = {}
        self._config: RunConfig | None = None
        self._started = 0.0
        self._model_record: dict[str, Any] = {}
        self._tv: TvRounds | None = None
        self._unplaced: dict[int, str] = {}  # tv_stable: drawn clients no node hosts
        self._app = "flower-app"

    @property
    def run_config(self) -> Mapping[str, Any]:
        """The app's run config (empty without a context)."""
        return dict(self.context.run_config) if self.context is not None else {}

    # ----- Flower's loop -----------------------------------------------------------------

    def start(  # noqa: PLR0913 - Strategy.start's signature
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Serve a pending unlearning request, else run the strategy's rounds, recording each."""
        caller = sys._getframe(1).f_globals  # the ServerApp's module: its app and model
        self._app = app_name(caller)
        pending = pending_request(self._app, self.run_config, self._given["run_dir"])
        if pending is not None:
            from fedunlearn.integrations.flower.app_unlearn import serve_request

            served = serve_request(
                grid,
                pending,
                evaluate_fn=evaluate_fn,
                accuracy_key=self.accuracy_key,
                round_timeout=timeout,
                node_timeout=self.node_timeout,
            )
            self.served = served.summary
            return served.result
        train_config = train_config if train_config is not None else ConfigRecord()
        self._open(grid, initial_arrays, num_rounds, train_config, app_namespaces(caller))

        def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            res = evaluate_fn(server_round, arrays) if evaluate_fn is not None else None
            if self._pending is not None and self._pending.round == server_round:
                self._pending.scalars.update(numbers(res))
            return res

        try:
            result = super().start(
                grid,
                initial_arrays,
                num_rounds=num_rounds,
                timeout=timeout,
                train_config=train_config,
                evaluate_config=evaluate_config,
                evaluate_fn=evaluate,
            )
            self._flush()
            self._finish(num_rounds)
        finally:
            if self.store is not None:
                self.store.close()
        return result

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Write the previous round, then build the round's train messages.

        The strategy builds them (its sampling), with the run seed and round added to the
        config (the ClientApp seeds its training from them); under ``tv_stable`` the wrapper
        does (``app_sampling``).
        """
        self._flush()
        assert self.layout is not None
        assert self.settings is not None
        self._before = self.layout.flatten(arrays)
        config[CONFIG_RUN_SEED] = int(self.settings.seed)
        config[CONFIG_ROUND] = int(server_round)
        if self._tv is not None:
            messages, self._unplaced = self._tv.messages(server_round, arrays, config)
        else:
            messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
            self._unplaced = {}
        self._asked = {int(m.metadata.dst_node_id) for m in messages}
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check the replies, let the strategy aggregate the good ones, keep the round."""
        started = time.perf_counter()
        assert self.layout is not None
        assert self._before is not None
        rnd = AppRound(server_round, self._before, self._before, missing=dict(self._unplaced))
        good = sort_replies(
            rnd,
            replies,
            self.layout,
            asked=self._asked,
            node_clients=self._node_clients,
            sizes=self._sizes,
            weight_key=self.weight_key,
            max_abs=self.max_abs,
        )
        own = time.perf_counter() - started
        if self._tv is not None:
            draw = self._tv.draws[server_round]
            rnd.multiplicity = dict(draw.multiplicity)
            _, metrics = self.strategy.aggregate_train(
                server_round, weigh_by_multiplicity(good, draw, self.weight_key)
            )
            assert self._config is not None
            record = self._tv.aggregate(
                server_round, self._before, rnd.accepted, aggregator_of(self._config)
            )
            arrays: ArrayRecord | None = self.layout.record(record.global_after)
        else:
            arrays, metrics = self.strategy.aggregate_train(server_round, good)
        started = time.perf_counter()
        if arrays is not None:
            rnd.after = self.layout.flatten(arrays)
        rnd.scalars.update(numbers(metrics))
        self._pending = rnd
        self.recording_seconds.append(own + time.perf_counter() - started)
        return arrays, metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's federated evaluation."""
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """The wrapped strategy's; its metrics join the round's, prefixed ``federated_``."""
        metrics = self.strategy.aggregate_evaluate(server_round, replies)
        if self._pending is not None and self._pending.round == server_round:
            self._pending.scalars.update(numbers(metrics, "federated_"))
        return metrics

    def summary(self) -> None:
        """The wrapped strategy's summary."""
        self.strategy.summary()

    # ----- the run directory -------------------------------------------------------------

    def _open(
        self,
        grid: Grid,
        initial: ArrayRecord,
        num_rounds: int,
        train_config: ConfigRecord,
        namespaces: list[Mapping[str, Any]],
    ) -> None:
        """Resolve the settings and the model, create the store, keep M_0 (round 0)."""
        self.settings = resolve_training(
            app=self._app,
            run_id=self.context.run_id if self.context is not None else None,
            given=self._given,
            run_config=self.run_config,
            train_config=dict(train_config),
        )
        self.run_dir = self.settings.run_dir
        if (self.run_dir / HISTORY_DIR).exists():
            raise ConfigError(f"{self.run_dir} already holds a run; choose another run_dir")
        self.choice = resolve_model(
            self.model,
            initial,
            input_shape=self.input_shape,
            num_classes=self.num_classes,
            options=self.model_options,
            namespaces=namespaces,
        )
        num_clients = self.num_clients
        if self.settings.sampling == "tv_stable":
            self._tv, num_clients = tv_rounds(
                grid,
                self.settings,
                participation=self._participation(),
                num_clients=num_clients,
                min_nodes=int(getattr(self.strategy, "min_available_nodes", 1)),
                node_timeout=self.node_timeout,
            )
            for cid, node in self._tv.nodes.nodes.items():
                self._node_clients.setdefault(node, set()).add(cid)
        num_clients = num_clients or max(1, len(list(grid.get_node_ids())))
        self._config = recorded_config(
            self.settings,
            self.choice,
            rounds=num_rounds,
            num_clients=num_clients,
            participation=self._participation(),
            history=self.history,
        )
        # the factory resolved, called and checked as for any run (fedunlearn.runs.user)
        model, self._model_record = user_model(
            self._config, None, self.choice.input_shape, self.choice.num_classes, None
        )
        # an arrays-only model holds the record's arrays in its order (app_model.ArraysModule)
        self.layout = (
            ArrayLayout.of(initial)
            if self.choice.arrays_only
            else model_layout(model, initial, self.choice.path)
        )
        self._policy = build_policy(
            self._config.history,
            PolicyEnv(
                model=model,
                final_round=num_rounds,
                seed=self.settings.seed,
                reference_set=_no_reference,
            ),
        )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / CONFIG_FILE).write_text(dump_config(self._config))
        (self.run_dir / METRICS_FILE).write_text("")
        self.store = HistoryStore.create(self.run_dir / HISTORY_DIR, meta=self._meta())
        self._started = time.perf_counter()
        flat = self.layout.flatten(initial)
        self._pending = AppRound(0, flat, flat)
        found = self.settings.found
        flwr_log(
            INFO,
            "fedunlearn: recording into %s (model: %s; local work: %s from %s; lr %g from %s; "
            "sampling %s)",
            self.run_dir,
            self.choice.how,
            f"{self.settings.local_steps} steps"
            if self.settings.local_steps
            else f"{self.settings.local_epochs} epoch(s)",
            found.get("local_steps" if self.settings.local_steps else "local_epochs"),
            self.settings.lr,
            found.get("lr"),
            self.settings.sampling,
        )

    def _participation(self) -> float:
        return min(1.0, float(getattr(self.strategy, "fraction_train", 1.0) or 1.0))

    def _meta(self) -> dict[str, Any]:
        assert self._config is not None
        assert self.layout is not None
        assert self.choice is not None
        return {
            "config": self._config.model_dump(mode="json"),
            "malicious": [],
            "num_params": self.layout.size,
            "client_sizes": {str(c): n for c, n in sorted(self._sizes.items())},
            "history_policy": self.history.policy,
            "history_every": self.history.every,
            # the server's threads: unlearning and a replay of it run at the same count
            "torch_threads": torch.get_num_threads(),
            # what UnlearnSession reads to open a run whose data stays on the clients
            "components": {
                "model": self._model_record,
                "data": {
                    "path": None,
                    "server_side": False,
                    "input_shape": list(self.choice.input_shape),
                    "num_classes": self.choice.num_classes,
                },
            },
            APP_META: {
                "layout": self.layout.to_meta(),
                "input_shape": list(self.choice.input_shape),
                "num_classes": self.choice.num_classes,
                "weight_key": self.weight_key,
                "strategy": type(self.strategy).__name__,
                "app": self._app,
                "arrays_only": self.choice.arrays_only,
                "accuracy_key": self.accuracy_key,
            },
        }

    def _flush(self) -> None:
        """Write the pending round (if any) into the store and the metrics file."""
        rnd, self._pending = self._pending, None
        if rnd is None or self.store is None or self.run_dir is None:
            return
        started = time.perf_counter()
        write_round(self.store, self._policy, rnd, self.run_dir / METRICS_FILE)
        if rnd.round and self.recording_seconds:
            self.recording_seconds[-1] += time.perf_counter() - started

    def _finish(self, num_rounds: int) -> None:
        """Store the clients' sizes (and their count) and write ``summary.json``."""
        assert self.store is not None
        assert self._config is not None
        assert self.run_dir is not None
        seen = max(self._sizes, default=-1) + 1
        if seen > self._config.data.num_clients and self._tv is None:  # tv_stable: K is frozen
            self._config = self._config.model_copy(
                update={"data": self._config.data.model_copy(update={"num_clients": seen})}
            )
            (self.run_dir / CONFIG_FILE).write_text(dump_config(self._config))
        self.store.update_meta(self._meta())
        final = self.store.read_model(num_rounds)
        summary = {
            "engine": "flower-app",
            "rounds": num_rounds,
            "resumed_from_round": None,
            "final_metrics": self.store.round_scalars(num_rounds),
            "malicious_clients": [],
            "num_params": self.layout.size if self.layout else None,
            "stored_bytes": self.store.stored_bytes(),
            "file_bytes": self.store.file_bytes(),
            "wall_seconds": time.perf_counter() - self._started,
            "recording_seconds": sum(self.recording_seconds),
            "executor": "flower",
            "device": "nodes",
            "final_model_norm": float(final.norm()),
            "client_sizes": {str(c): n for c, n in sorted(self._sizes.items())},
        }
        write_json(self.run_dir / SUMMARY_FILE, summary)
        flwr_log(
            INFO,
            "fedunlearn: recorded %d round(s) of %d client(s) in %s; to forget a client: "
            "fedunlearn unlearn %s --forget ID --method %s --out %s, then flwr run the app "
            "again",
            num_rounds,
            len(self._sizes),
            self.run_dir,
            self.run_dir,
            "tv_exact" if self._tv is not None else "retrain",
            self.run_dir / "forget.json",
        )


def _no_reference(size: int) -> Any:
    raise ConfigError("a Flower app with node-local data has no reference set on the server")
