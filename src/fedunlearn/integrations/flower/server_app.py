"""Flower ``ServerApp``: train a run with history recording, unlearn from it, or continue it.

A job (``FlowerJob``) says what to do; the ServerApp reads it from the Flower run config
(``flwr run``; keys in ``FlowerJob.from_run_config``, defaults in the app's ``pyproject.toml``).
``make_app(base_dir)`` builds that ServerApp for a Flower App directory (relative config paths
are read from it; ``bundle.write_app`` and ``examples/flower-app`` use it); the module-level
``app`` has no base directory. Results are written to disk, in the same layout as the in-process
engine:

- ``train``: ``<run-dir>/config.yaml``, ``history/`` (the store: M_0, every round's global
  model and aggregate, the updates the recording policy keeps, every sampled client's outcome,
  ``missing`` included), ``metrics.jsonl`` and ``summary.json`` (with ``engine: flower``, the
  missing clients per round and the wire statistics). The run then opens with
  ``UnlearnSession`` / ``fedunlearn unlearn`` like any other.
- ``unlearn``: runs one registered method on a finished run in ``<run-dir>``; fresh client work
  (Retrain's rounds, FedEraser's calibration, FedRecover's corrections, ...) goes to the
  remaining clients' SuperNodes through the Grid. Writes the result JSON (same fields as
  ``fedunlearn unlearn --out``) and the model next to it (``.safetensors``: the module's
  ``state_dict`` and spec, ``fedunlearn.models.load_model`` reads it).

``run-dir`` must be absolute (the SuperLink runs the ServerApp in a process and directory of
its own); an empty one means ``~/fedunlearn-runs/flower-<run id>`` for training. A relative
``config-path`` is read from the app directory, a relative ``result-path`` goes into the run
directory.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from logging import INFO
from pathlib import Path
from typing import Any

import torch
from flwr.app import Context
from flwr.common import log as flwr_log
from flwr.serverapp import Grid, ServerApp

from fedunlearn.config import RunConfig, dump_config, load_config
from fedunlearn.errors import ConfigError
from fedunlearn.experiments.lifecycle import save_for_apply
from fedunlearn.fl.federation import Federation
from fedunlearn.history.policy import DeferredPolicy, RecordingPolicy, update_dtype_of
from fedunlearn.history.store import HistoryStore, RoundEntry
from fedunlearn.integrations.flower.driver import (
    FlowerClients,
    missing_json,
    source_metadata,
)
from fedunlearn.integrations.flower.strategy import (
    HistoryStrategy,
    MissingAwareRecorder,
    from_arrays,
    to_arrays,
)
from fedunlearn.models import save_model
from fedunlearn.runs import (
    CONFIG_FILE,
    HISTORY_DIR,
    METRICS_FILE,
    SUMMARY_FILE,
    MetricsWriter,
    build_setup,
    continue_run,
    load_run_config,
    make_recording_policy,
    resolve_config,
)
from fedunlearn.runs.rounds import on_cadence
from fedunlearn.runs.setup import sampler_of
from fedunlearn.runs.train import federation_meta
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

MODES = ("train", "unlearn", "continue")


@dataclass(frozen=True)
class FlowerJob:
    """What a fedunlearn ServerApp does.

    Attributes:
        mode: ``train`` (a new run into ``run_dir``), ``unlearn`` (a method on it) or
            ``continue`` (``rounds`` more rounds of it).
        run_dir: Absolute run directory.
        config_path: Absolute path of the run config YAML (``train`` only).
        method: Unlearning method's registry name (``unlearn``).
        method_params: The method's hyperparameters.
        forget: Client ids to remove (``unlearn``).
        kind: ``forget`` or ``recover``.
        result_path: Where the unlearning result JSON goes (default
            ``<run_dir>/flower_<method>.json``; the model goes to the same name with
            ``.safetensors``).
        round_timeout: Seconds to wait for one round's replies; late clients are missing.
        node_timeout: Seconds to wait for the SuperNodes to connect.
        rounds: ``continue``: how many rounds to add (0: finish an interrupted continuation).
    """

    mode: str
    run_dir: Path
    config_path: Path | None = None
    method: str = "retrain"
    method_params: dict[str, Any] = field(default_factory=dict)
    forget: tuple[int, ...] = ()
    kind: str = "forget"
    result_path: Path | None = None
    round_timeout: float = 600.0
    node_timeout: float = 120.0
    rounds: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"job mode must be one of {', '.join(MODES)}; got {self.mode!r}")
        for name in ("run_dir", "config_path", "result_path"):
            value = getattr(self, name)
            if value is not None and not Path(value).is_absolute():
                raise ConfigError(
                    f"{name.replace('_', '-')} must be an absolute path (the ServerApp runs in "
                    f"another process and directory); got {str(value)!r}"
                )
        if self.mode == "train" and self.config_path is None:
            raise ConfigError("a train job needs config-path, the run config YAML")
        if self.mode == "unlearn" and not self.forget:
            raise ConfigError('an unlearn job needs forget, e.g. forget="3,7"')
        if self.rounds < 0 or (self.rounds and self.mode != "continue"):
            raise ConfigError(
                f"rounds is how many rounds a continue job adds (>= 1, or 0 to finish an "
                f"interrupted one); got {self.rounds} in mode {self.mode!r} (a train job's rounds "
                "are its config's training.rounds)"
            )

    @classmethod
    def from_run_config(
        cls,
        run_config: dict[str, Any],
        *,
        base_dir: Path | None = None,
        run_id: int | None = None,
    ) -> FlowerJob:
        """Build a job from Flower run config keys.

        Keys: ``mode``, ``run-dir``, ``config-path``, ``method``, ``method-params`` (JSON),
        ``forget`` (comma-separated ids), ``kind``, ``result-path``, ``round-timeout``,
        ``node-timeout``, ``rounds``; empty strings mean unset.

        Args:
            run_config: The run config (``context.run_config``).
            base_dir: The app directory: a relative ``config-path`` is read from it.
            run_id: Flower's run id: an empty ``run-dir`` of a train job becomes
                ``~/fedunlearn-runs/flower-<run_id>``.

        Raises:
            ConfigError: for a value of the wrong form (named, with what is allowed).
        """

        def text(key: str) -> str:
            return str(run_config.get(key, "") or "").strip()

        try:
            forget = tuple(int(c) for c in text("forget").split(",") if c.strip())
        except ValueError:
            raise ConfigError(
                'forget takes comma-separated client ids, e.g. forget="3,7"; '
                f"got {text('forget')!r}"
            ) from None
        try:
            method_params = json.loads(text("method-params") or "{}")
        except json.JSONDecodeError as err:
            raise ConfigError(
                f"method-params must be a JSON object, e.g. '{{\"calibration_ratio\": 0.5}}'; "
                f"got {text('method-params')!r} ({err})"
            ) from None
        try:
            rounds = int(text("rounds") or 0)
        except ValueError:
            raise ConfigError(
                f"rounds takes a whole number, e.g. rounds=10; got {text('rounds')!r}"
            ) from None
        mode = text("mode") or "train"
        run_dir = Path(text("run-dir")) if text("run-dir") else None
        if run_dir is None and mode == "train" and run_id is not None:
            run_dir = Path.home() / "fedunlearn-runs" / f"flower-{run_id}"
        if run_dir is None:
            raise ConfigError(
                f"a job in mode {mode!r} needs run-dir, the absolute run directory "
                "(--run-config 'run-dir=\"/abs/path\"')"
            )
        config_path = Path(text("config-path")) if text("config-path") else None
        if config_path is not None and not config_path.is_absolute() and base_dir is not None:
            config_path = Path(base_dir) / config_path
        result_path = Path(text("result-path")) if text("result-path") else None
        if result_path is not None and not result_path.is_absolute() and run_dir.is_absolute():
            result_path = run_dir / result_path
        return cls(
            mode=mode,
            run_dir=run_dir,
            config_path=config_path,
            method=text("method") or "retrain",
            method_params=method_params,
            forget=forget,
            kind=text("kind") or "forget",
            result_path=result_path,
            round_timeout=float(run_config.get("round-timeout", 600.0)),
            node_timeout=float(run_config.get("node-timeout", 120.0)),
            rounds=rounds,
        )

    def to_run_config(self) -> dict[str, str | float]:
        """Return the job as Flower run config keys (``from_run_config`` reads them back)."""
        return {
            "mode": self.mode,
            "run-dir": str(self.run_dir),
            "config-path": str(self.config_path or ""),
            "method": self.method,
            "method-params": json.dumps(self.method_params, sort_keys=True),
            "forget": ",".join(str(c) for c in self.forget),
            "kind": self.kind,
            "result-path": str(self.result_path or ""),
            "round-timeout": float(self.round_timeout),
            "node-timeout": float(self.node_timeout),
            "rounds": int(self.rounds),
        }


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def refuse_dp(config: RunConfig, what: str) -> None:
    """Refuse a DP config over the Grid: the ClientApp trains without the run's mechanism.

    DP-SGD and clip-and-noise run in fedunlearn's in-process training (``runs.wrap_privacy``);
    a ClientApp's train handler trains plainly, so a DP run trained over Flower would carry
    a config that says DP and rounds that are not (and an empty ledger).
    """
    if config.privacy.enabled:
        raise ConfigError(
            f"privacy.enabled: DP is not implemented over Flower (the ClientApp trains without "
            f"the mechanism), so mode '{what}' refuses a DP run; train it in-process with "
            "'fedunlearn train' (and '--continue'), or set privacy.enabled: false"
        )


def train_on_grid(grid: Grid, config: RunConfig, job: FlowerJob) -> dict[str, Any]:
    """Train ``config`` over the Grid into ``job.run_dir`` with recording; return the summary.

    Mirrors ``fedunlearn.runs.train_run`` (same store metadata, round 0, recording policy,
    metrics file and summary), with ``HistoryStrategy`` in place of ``run_rounds``.

    Raises:
        ConfigError: if ``run_dir`` already holds a run (resume is not supported over Flower).
    """
    config = resolve_config(config)  # as train_run: the stored config names every option
    refuse_dp(config, "train")
    if config.training.shards > 1:
        raise ConfigError(
            "training.shards > 1: sharded training is not implemented over Flower yet; train "
            "it in-process with 'fedunlearn train'"
        )
    run_dir = job.run_dir
    history_dir = run_dir / HISTORY_DIR
    if history_dir.exists():
        raise ConfigError(f"{run_dir} already holds a run; choose another run-dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    config_yaml = dump_config(config)
    (run_dir / CONFIG_FILE).write_text(config_yaml)
    started = time.perf_counter()
    setup = build_setup(config)
    fed = setup.federation
    store = HistoryStore.create(history_dir, meta=federation_meta(config, fed))
    try:
        store.write_round(
            RoundEntry(
                round=0,
                global_model=setup.initial_params,
                scalars=setup.evaluate(setup.initial_params),
            )
        )
        (run_dir / METRICS_FILE).write_text("")
        policy = make_recording_policy(config, setup)
        if isinstance(policy, DeferredPolicy):
            policy.resume_round(store)  # sets the policy's state from a store holding M_0
        clients = FlowerClients(
            grid,
            setup.federation,
            config_yaml,
            round_timeout=job.round_timeout,
            node_timeout=job.node_timeout,
        )
        strategy = HistoryStrategy(
            clients,
            setup.aggregator,
            participation=config.training.participation,
            sampler=sampler_of(config),
            evaluate=on_cadence(
                setup.evaluate, config.training.eval_every, range(1, config.training.rounds + 1)
            ),
            observers=[
                MissingAwareRecorder(
                    store, policy, clients.missing, update_dtype_of(config.history.encoding)
                ),
                MetricsWriter(run_dir / METRICS_FILE),
            ],
        )
        result = strategy.start(
            grid,
            to_arrays(setup.initial_params),
            num_rounds=config.training.rounds,
            timeout=job.round_timeout,
        )
        final = from_arrays(result.arrays) if config.training.rounds else setup.initial_params
        stats = clients.stats
        summary = {
            "engine": "flower",
            "rounds": config.training.rounds,
            "resumed_from_round": None,
            "final_metrics": store.round_scalars(config.training.rounds),
            "malicious_clients": sorted(fed.malicious),
            "num_params": fed.num_params,
            "stored_bytes": store.stored_bytes(),
            "file_bytes": store.file_bytes(),
            "wall_seconds": time.perf_counter() - started,
            "executor": "flower",
            "device": str(fed.device),  # where the server evaluates
            "missing": missing_json(clients.missing),
            "final_model_norm": float(final.norm()),
            "wire": {
                "messages": stats.messages,
                "bytes_sent": stats.bytes_sent,
                "bytes_received": stats.bytes_received,
                "encode_seconds": stats.encode_seconds,
                "exchange_seconds": stats.exchange_seconds,
                "exchange_seconds_by_round": stats.exchanges,
                "decode_seconds": stats.decode_seconds,
                "discover_seconds": stats.discover_seconds,
            },
        }
        _write_json(run_dir / SUMMARY_FILE, summary)
        return summary
    finally:
        setup.close()
        store.close()


def unlearn_on_grid(grid: Grid, job: FlowerJob) -> dict[str, Any]:
    """Run ``job.method`` on the finished run in ``job.run_dir``, clients over the Grid.

    The session (history read-only, the run's setup, request checks) is ``UnlearnSession``'s;
    only the clients differ: the context wraps ``FlowerClients``, so the method's fresh
    client work goes to the remaining clients' SuperNodes and is metered as in-process. The
    request is cumulative (``UnlearnSession.cumulative``), and the result is written for
    ``fedunlearn apply`` (``save_for_apply``), as ``fedunlearn unlearn --out`` writes it.

    Returns:
        The result summary written to ``job.result_path`` (the model goes next to it,
        ``.safetensors``; the apply file ``.apply.safetensors``).
    """
    unlearner = make_method(job.method, job.method_params)
    out = job.result_path or job.run_dir / f"flower_{job.method}.json"
    with UnlearnSession(job.run_dir) as session:
        request = session.cumulative(UnlearnRequest.of(job.forget, job.kind))
        clients = FlowerClients(
            grid,
            session.federation,
            dump_config(session.run_view.config),
            round_timeout=job.round_timeout,
            node_timeout=job.node_timeout,
        )
        context = session.context(request, clients=clients)
        result = unlearner.unlearn(request, context)
        quality = session.evaluation.evaluate(result.params)
        model = session.run_view.model
        summary = {
            "engine": "flower",
            "method": job.method,
            "request": session.request_summary(request),
            "run": session.identity(),
            "params": unlearner.params.model_dump(mode="json"),
            **quality,
            "costs": result.costs.to_dict(),
            "round_metrics": [dict(r) for r in result.round_metrics],
            "details": result.details.to_dict(),
            "lineage": result.lineage.to_dict() if result.lineage else None,
            "missing": missing_json(clients.missing),
        }
    out.parent.mkdir(parents=True, exist_ok=True)
    model_file = out.with_suffix(".safetensors")
    meta = source_metadata(job.run_dir, job.method, request.forget, job.kind, "flower")
    save_model(model_file, model, params=result.params, metadata=meta)
    summary["model_file"] = str(model_file)
    summary = json.loads(json.dumps(summary, default=_jsonable))  # what the file will hold
    save_for_apply(out, summary, result)  # the apply file, and the seal over the summary
    _write_json(out, summary)
    return summary


class _GridClients:
    """Builds a continuation's ``FlowerClients`` and the recorder that notes their missing."""

    def __init__(self, grid: Grid, config_yaml: str, job: FlowerJob) -> None:
        self._grid, self._yaml, self._job = grid, config_yaml, job
        self.clients: FlowerClients | None = None

    def build(self, federation: Federation) -> FlowerClients:
        """Return the run's clients over the Grid (``continue_run``'s ``clients``)."""
        self.clients = FlowerClients(
            self._grid,
            federation,
            self._yaml,
            round_timeout=self._job.round_timeout,
            node_timeout=self._job.node_timeout,
        )
        return self.clients

    def recorder(
        self, store: HistoryStore, policy: RecordingPolicy | DeferredPolicy
    ) -> MissingAwareRecorder:
        """Return the recorder (``continue_run``'s ``recorder``), after ``build``."""
        if self.clients is None:
            raise RuntimeError("the recorder is built after the clients")
        return MissingAwareRecorder(store, policy, self.clients.missing)


def continue_on_grid(grid: Grid, job: FlowerJob) -> dict[str, Any]:
    """Train ``job.rounds`` more rounds of the run in ``job.run_dir``, clients over the Grid.

    ``fedunlearn.runs.continue_run`` with ``FlowerClients`` in place of the in-process
    federation and ``MissingAwareRecorder`` as the recorder: same refusals (an unfinished
    run, another round count while a continuation is unfinished), the target committed before
    the first round, and only never-forgotten clients sampled. A DP run is refused: the
    ClientApp trains without the run's mechanism (``refuse_dp``). Writes
    ``<run-dir>/continue_summary.json``.

    Returns:
        ``continue_run``'s summary plus ``engine``, ``missing`` and ``wire``.
    """
    config = load_run_config(job.run_dir)
    refuse_dp(config, "continue")
    grid_clients = _GridClients(grid, dump_config(config), job)
    summary = continue_run(
        job.run_dir,
        job.rounds or None,
        clients=grid_clients.build,
        recorder=grid_clients.recorder,
    )
    clients = grid_clients.clients
    missing = {} if clients is None else clients.missing
    summary = {
        "engine": "flower",
        **summary,
        "missing": missing_json(missing),
        "wire": None
        if clients is None
        else {
            "messages": clients.stats.messages,
            "bytes_sent": clients.stats.bytes_sent,
            "bytes_received": clients.stats.bytes_received,
        },
    }
    _write_json(
        job.run_dir / "continue_summary.json", json.loads(json.dumps(summary, default=_jsonable))
    )
    return summary


def _jsonable(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, set | frozenset | tuple):
        return sorted(value)
    return str(value)


def run_job(grid: Grid, job: FlowerJob) -> dict[str, Any]:
    """Run a job on a Grid and return what it wrote (the summary)."""
    if job.mode == "train":
        config = load_config(job.config_path or "")  # FlowerJob requires it for train
        return train_on_grid(grid, config, job)
    if job.mode == "continue":
        return continue_on_grid(grid, job)
    return unlearn_on_grid(grid, job)


def make_app(base_dir: Path | None = None) -> ServerApp:
    """Return the ServerApp that runs the job its Flower run config describes.

    Args:
        base_dir: The Flower App directory; a relative ``config-path`` is read from it (None:
            paths must be absolute).
    """
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        job = FlowerJob.from_run_config(
            dict(context.run_config), base_dir=base_dir, run_id=context.run_id
        )
        flwr_log(INFO, "fedunlearn: %s job, run directory %s", job.mode, job.run_dir)
        run_job(grid, job)

    return server_app


app = make_app()
