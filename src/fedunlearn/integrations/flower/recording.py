"""``Recording``: any Flower Message-API ``Strategy``, every round kept in fedunlearn's history.

In the user's own ServerApp::

    strategy = Recording(FedAvg(fraction_train=1.0), run_dir="/abs/run",
                         model="my_app.task:make_net", input_shape=(1, 28, 28), num_classes=10)
    result = strategy.start(grid, ArrayRecord(net.state_dict()), num_rounds=5, ...)

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
  ``model.factory`` (the import path ``"pkg.module:function"``, built and checked as any run's
  factory by ``fedunlearn.runs.user``, and against the arrays' keys and shapes before round 1;
  the flat vectors follow the model's order: parameters, then persistent buffers), the local
  training settings fresh unlearning work reuses (``lr`` and ``local-epochs`` of the train
  config).

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

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from torch import nn

from fedunlearn.config import HistoryConfig, RunConfig, dump_config, parse_config
from fedunlearn.errors import ConfigError
from fedunlearn.fl.records import ClientUpdate, RoundRecord, UpdateStatus
from fedunlearn.history.policy import DOT_AGGREGATE_KEY, PolicyEnv, build_policy
from fedunlearn.history.store import ClientRecord, HistoryStore, RoundEntry
from fedunlearn.integrations.flower.app_protocol import (
    DEFAULT_MAX_ABS,
    DEFAULT_WEIGHT_KEY,
    ArrayLayout,
    Reply,
    check_reply,
)
from fedunlearn.models import federated_buffers
from fedunlearn.runs import (
    CONFIG_FILE,
    HISTORY_DIR,
    METRICS_FILE,
    SUMMARY_FILE,
    metrics_line,
    resolve_config,
)
from fedunlearn.runs.rundir import write_json
from fedunlearn.runs.user import user_model

log = logging.getLogger(__name__)

POLICIES = ("all", "every", "none")
APP_META = "flower_app"  # store metadata: what unlearning over the app needs


def model_layout(model: nn.Module, record: ArrayRecord, path: str) -> ArrayLayout:
    """Return the layout of ``record`` in the model's flat order, checked against the model.

    Raises:
        ConfigError: the record's arrays are not the model's parameters and persistent buffers
            (names and shapes).
    """
    state = dict(model.named_parameters()) | dict(federated_buffers(model))
    order = list(dict(model.named_parameters())) + [n for n, _ in federated_buffers(model)]
    mine = {n: tuple(t.shape) for n, t in state.items()}
    theirs = {k: tuple(int(d) for d in record[k].shape) for k in record.keys()}
    if mine != theirs:
        lacking = sorted(set(mine) - set(theirs))
        extra = sorted(set(theirs) - set(mine))
        shapes = sorted(k for k in set(mine) & set(theirs) if mine[k] != theirs[k])
        raise ConfigError(
            f"model {path!r} does not fit the initial arrays: they must be the same (the model's "
            f"parameters and buffers); missing {lacking[:4]}, extra {extra[:4]}, other shapes "
            f"{[(k, mine[k], theirs[k]) for k in shapes[:3]]}"
        )
    return ArrayLayout.of(record, order)


@dataclass
class _Round:
    """One aggregated round, written when its evaluation is known."""

    round: int
    before: torch.Tensor
    after: torch.Tensor
    accepted: dict[int, Reply] = field(default_factory=dict)
    rejected: dict[int, str] = field(default_factory=dict)
    missing: dict[int, str] = field(default_factory=dict)
    unnamed: list[str] = field(default_factory=list)  # rejected replies with no client record
    scalars: dict[str, Any] = field(default_factory=dict)


def _numbers(record: MetricRecord | None, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in (record or {}).items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[prefix + key] = float(value)
    return out


class Recording(Strategy):
    """A Message-API strategy whose rounds are recorded into a fedunlearn run directory.

    Args:
        strategy: The wrapped strategy (``FedAvg(...)``, any ``Strategy``).
        run_dir: The run directory to create (must not hold a run).
        model: Import path of the model factory, ``"pkg.module:function"``, called as
            ``function(input_shape, num_classes, **model_options)``.
        input_shape: Shape of one example (the factory's first argument).
        num_classes: Number of classes (its second).
        model_options: Keyword options of the factory.
        policy: Recording policy: ``all``, ``every`` or ``none``.
        every: With ``every``: keep the updates of every k-th round.
        num_clients: Number of clients (default: the connected nodes at the start, or more
            when replies name higher ids).
        seed: The run seed (recorded; fresh unlearning work derives its seeds from it).
        weight_key: The sample-count key of a reply's metrics (default: the strategy's
            ``weighted_by_key``, else ``num-examples``).
        max_abs: Replies holding a value above this (in absolute value) are rejected.
        lr: Learning rate recorded for fresh unlearning work (default: ``train_config["lr"]``).
        local_epochs: Local epochs recorded (default: ``train_config["local-epochs"]``, else 1).
        batch_size: Batch size recorded (informational: the ClientApp batches its own data).
    """

    def __init__(
        self,
        strategy: Strategy,
        *,
        run_dir: str | Path,
        model: str,
        input_shape: tuple[int, ...],
        num_classes: int,
        model_options: dict[str, Any] | None = None,
        policy: str = "all",
        every: int = 5,
        num_clients: int | None = None,
        seed: int = 0,
        weight_key: str | None = None,
        max_abs: float = DEFAULT_MAX_ABS,
        lr: float | None = None,
        local_epochs: int | None = None,
        batch_size: int = 32,
    ) -> None:
        if policy not in POLICIES:
            raise ConfigError(
                f"Recording policy {policy!r}: a Flower app with node-local data records with "
                f"{', '.join(POLICIES)} (policies that read the clients' data on the server "
                "cannot run here)"
            )
        self.strategy = strategy
        self.run_dir = Path(run_dir)
        self.model_path = model
        self.input_shape = tuple(int(s) for s in input_shape)
        self.num_classes = int(num_classes)
        self.model_options = dict(model_options or {})
        self.history = HistoryConfig(policy=policy, every=every)
        self.num_clients = num_clients
        self.seed = int(seed)
        self.weight_key = weight_key or getattr(strategy, "weighted_by_key", DEFAULT_WEIGHT_KEY)
        self.max_abs = float(max_abs)
        self.lr, self.local_epochs, self.batch_size = lr, local_epochs, batch_size
        self.recording_seconds: list[float] = []  # the wrapper's own time per round
        self.store: HistoryStore | None = None
        self.layout: ArrayLayout | None = None
        self._policy: Any = None
        self._pending: _Round | None = None
        self._before: torch.Tensor | None = None
        self._asked: set[int] = set()
        self._node_clients: dict[int, set[int]] = {}
        self._sizes: dict[int, int] = {}
        self._config: RunConfig | None = None
        self._started = 0.0
        self._model_record: dict[str, Any] = {}

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
        """Run the wrapped strategy's rounds (``Strategy.start``), recording each one."""
        self._open(grid, initial_arrays, num_rounds, train_config or ConfigRecord())

        def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            res = evaluate_fn(server_round, arrays) if evaluate_fn is not None else None
            if self._pending is not None and self._pending.round == server_round:
                self._pending.scalars.update(_numbers(res))
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
        """Write the previous round, then let the strategy build its train messages."""
        self._flush()
        assert self.layout is not None  # set by start
        self._before = self.layout.flatten(arrays)
        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
        self._asked = {int(m.metadata.dst_node_id) for m in messages}
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check the replies, let the strategy aggregate the good ones, keep the round."""
        started = time.perf_counter()
        assert self.layout is not None and self._before is not None
        rnd = _Round(server_round, self._before, self._before)
        good: list[Message] = []
        replied: set[int] = set()
        for reply in replies:
            node = int(reply.metadata.src_node_id)
            replied.add(node)
            if reply.has_error():
                reason = reply.error.reason.strip()[-300:]
                for cid in sorted(self._node_clients.get(node, ())):
                    rnd.missing[cid] = f"client error: ...{reason}"
                if not self._node_clients.get(node):
                    rnd.unnamed.append(f"node {node} replied with an error: ...{reason}")
                continue
            cid, out = check_reply(
                reply, self.layout, weight_key=self.weight_key, max_abs=self.max_abs
            )
            if isinstance(out, Reply) and out.client_id in rnd.accepted:
                first = rnd.accepted[out.client_id].node
                out = f"client {cid}: a second reply this round (node {node}; first: node {first})"
                cid = None  # keep the first reply's record
            if isinstance(out, str):
                log.warning("round %d: rejected reply: %s", server_round, out)
                if cid is None:
                    rnd.unnamed.append(out)
                else:
                    rnd.rejected[cid] = out
                    self._node_clients.setdefault(node, set()).add(cid)
                continue
            rnd.accepted[out.client_id] = out
            self._node_clients.setdefault(node, set()).add(out.client_id)
            self._sizes[out.client_id] = out.num_samples
            good.append(reply)
        for node in sorted(self._asked - replied):
            for cid in sorted(self._node_clients.get(node, ())):
                rnd.missing.setdefault(cid, "no reply before the round's timeout")
        own = time.perf_counter() - started
        arrays, metrics = self.strategy.aggregate_train(server_round, good)
        started = time.perf_counter()
        if arrays is not None:
            rnd.after = self.layout.flatten(arrays)
        rnd.scalars.update(_numbers(metrics))
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
            self._pending.scalars.update(_numbers(metrics, "federated_"))
        return metrics

    def summary(self) -> None:
        """The wrapped strategy's summary."""
        self.strategy.summary()

    # ----- the run directory -------------------------------------------------------------

    def _open(
        self, grid: Grid, initial: ArrayRecord, num_rounds: int, train_config: ConfigRecord
    ) -> None:
        """Check the model against the arrays, create the store, keep M_0 (round 0)."""
        if (self.run_dir / HISTORY_DIR).exists():
            raise ConfigError(f"{self.run_dir} already holds a run; choose another run_dir")
        num_clients = self.num_clients or max(1, len(list(grid.get_node_ids())))
        self._config = self._run_config(num_rounds, num_clients, train_config)
        # the factory resolved, called and checked as for any run (fedunlearn.runs.user)
        model, self._model_record = user_model(
            self._config, None, self.input_shape, self.num_classes, None
        )
        self.layout = model_layout(model, initial, self.model_path)
        self._policy = build_policy(
            self._config.history,
            PolicyEnv(
                model=model, final_round=num_rounds, seed=self.seed, reference_set=_no_reference
            ),
        )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / CONFIG_FILE).write_text(dump_config(self._config))
        (self.run_dir / METRICS_FILE).write_text("")
        self.store = HistoryStore.create(self.run_dir / HISTORY_DIR, meta=self._meta())
        self._started = time.perf_counter()
        flat = self.layout.flatten(initial)
        self._pending = _Round(0, flat, flat)

    def _run_config(self, rounds: int, num_clients: int, train_config: ConfigRecord) -> RunConfig:
        lr = self.lr if self.lr is not None else float(train_config.get("lr", 0.05))
        epochs = self.local_epochs or int(train_config.get("local-epochs", 1))
        return resolve_config(
            parse_config(
                {
                    "seed": self.seed,
                    "data": {"dataset": "node-local", "num_clients": num_clients},
                    "model": {"factory": self.model_path, "options": self.model_options},
                    "training": {
                        "rounds": rounds,
                        "local_epochs": epochs,
                        "lr": lr,
                        "batch_size": self.batch_size,
                        # the share of clients the strategy samples (FedAvg's fraction_train)
                        "participation": min(
                            1.0, float(getattr(self.strategy, "fraction_train", 1.0) or 1.0)
                        ),
                        "executor": "serial",
                        "device": "cpu",
                    },
                    "history": self.history.model_dump(),
                },
                "<Recording>",
            )
        )

    def _meta(self) -> dict[str, Any]:
        assert self._config is not None and self.layout is not None
        return {
            "config": self._config.model_dump(mode="json"),
            "malicious": [],
            "num_params": self.layout.size,
            "client_sizes": {str(c): n for c, n in sorted(self._sizes.items())},
            "history_policy": self.history.policy,
            "history_every": self.history.every,
            # what UnlearnSession reads to open a run whose data stays on the clients
            "components": {
                "model": self._model_record,
                "data": {
                    "path": None,
                    "server_side": False,
                    "input_shape": list(self.input_shape),
                    "num_classes": self.num_classes,
                },
            },
            APP_META: {
                "layout": self.layout.to_meta(),
                "input_shape": list(self.input_shape),
                "num_classes": self.num_classes,
                "weight_key": self.weight_key,
                "strategy": type(self.strategy).__name__,
            },
        }

    def _flush(self) -> None:
        """Write the pending round (if any) into the store and the metrics file."""
        rnd, self._pending = self._pending, None
        if rnd is None or self.store is None:
            return
        started = time.perf_counter()
        aggregate = rnd.after - rnd.before
        scalars = dict(rnd.scalars)
        if rnd.round == 0:
            self.store.write_round(RoundEntry(round=0, global_model=rnd.after, scalars=scalars))
        else:
            updates = {c: r.params - rnd.before for c, r in rnd.accepted.items()}
            record = RoundRecord(
                round=rnd.round,
                global_before=rnd.before,
                global_after=rnd.after,
                aggregate=aggregate,
                updates=tuple(
                    ClientUpdate(c, d, rnd.accepted[c].num_samples, rnd.accepted[c].loss or 0.0)
                    for c, d in updates.items()
                ),
            )
            keep = self._policy.updates_to_store(record)
            agg64 = aggregate.to(torch.float64)
            clients = [
                ClientRecord(
                    client_id=c,
                    status=UpdateStatus.ACCEPTED.value,
                    num_samples=rnd.accepted[c].num_samples,
                    norm=float(d.norm()),
                    loss=rnd.accepted[c].loss,
                    scalars={DOT_AGGREGATE_KEY: float(d.to(torch.float64) @ agg64)},
                )
                for c, d in updates.items()
            ]
            clients += [
                ClientRecord(client_id=c, status=UpdateStatus.REJECTED.value, reason=why)
                for c, why in sorted(rnd.rejected.items())
                if c not in rnd.accepted
            ]
            clients += [
                ClientRecord(client_id=c, status=UpdateStatus.MISSING.value, reason=why)
                for c, why in sorted(rnd.missing.items())
                if c not in rnd.accepted and c not in rnd.rejected
            ]
            if rnd.unnamed:
                scalars["rejected_replies"] = len(rnd.unnamed)
                scalars["rejected_reasons"] = " | ".join(rnd.unnamed)[:2000]
            self.store.write_round(
                RoundEntry(
                    round=rnd.round,
                    global_model=rnd.after,
                    aggregate=aggregate,
                    updates={c: d for c, d in updates.items() if c in keep},
                    clients=clients,
                    scalars=scalars,
                )
            )
        row = metrics_line(rnd.round, scalars)
        row["num_accepted"] = len(rnd.accepted)
        row["num_rejected"] = len(rnd.rejected) + len(rnd.unnamed)
        with (self.run_dir / METRICS_FILE).open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        if rnd.round and self.recording_seconds:
            self.recording_seconds[-1] += time.perf_counter() - started

    def _finish(self, num_rounds: int) -> None:
        """Store the clients' sizes (and their count) and write ``summary.json``."""
        assert self.store is not None and self._config is not None
        seen = max(self._sizes, default=-1) + 1
        if seen > self._config.data.num_clients:
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


def _no_reference(size: int) -> Any:
    raise ConfigError("a Flower app with node-local data has no reference set on the server")
