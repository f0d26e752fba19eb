"""The recorded rounds of a run: the one assembly ``train``, ``--resume`` and ``--continue`` share.

``recorded_setup`` builds what a run's later rounds train under (the ``auto`` executor pinned to
the one the store recorded, a warning when a user component changed) and ``train_recorded``
trains rounds into the store: the recording policy's state and the DP schedule's restored from
the store (``resume_state``), ``metrics.jsonl`` rewritten from it, then ``run_rounds`` with the
recorder, the wall clock, the metrics writer and the DP ledger as observers. ``train_run``
(``fedunlearn.runs.train``) and ``continue_run`` (``fedunlearn.runs.continuation``) differ only
in what they pass: the target round, the clients never forgotten, the policy's environment.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import torch

from fedunlearn.config import RunConfig
from fedunlearn.data import FederatedData
from fedunlearn.fl.clients import RunClients
from fedunlearn.fl.engine import RoundObserver, run_rounds
from fedunlearn.fl.metrics import CLIENTS_LOSS_KEY
from fedunlearn.fl.records import RoundRecord
from fedunlearn.history.policy import (
    POLICIES,
    DeferredPolicy,
    HistoryRecorder,
    PolicyEnv,
    RecordingPolicy,
    build_policy,
    resolve_history,
    update_dtype_of,
)
from fedunlearn.history.store import HistoryStore
from fedunlearn.models.registry import ModelFactory
from fedunlearn.privacy.training import PrivateTraining
from fedunlearn.runs.components import warn_changed_components
from fedunlearn.runs.run_files import rewrite_metrics
from fedunlearn.runs.rundir import METRICS_FILE, MetricsWriter
from fedunlearn.runs.setup import (
    DEFAULT_LOSS_SAMPLES,
    Setup,
    build_setup,
    clients_loss,
    reference_set,
    sampler_of,
    with_recorded_executor,
)

Model = TypeVar("Model")  # what an evaluation is given: flat parameters, or shard models

__all__ = [
    "RecorderFactory",
    "Trained",
    "WallClock",
    "clients_loss_samples",
    "make_recording_policy",
    "policy_env",
    "recorded_setup",
    "records_client_values",
    "resume_state",
    "train_recorded",
    "on_cadence",
    "training_evaluator",
]

#: Builds the observer that records each round into the store (default ``HistoryRecorder``).
RecorderFactory = Callable[[HistoryStore, RecordingPolicy | DeferredPolicy], RoundObserver]


def policy_env(
    setup: Setup,
    privacy: PrivateTraining | None = None,
    clients: Collection[int] | None = None,
) -> PolicyEnv:
    """Return what the run's recording policy may ask for (model, reference set, last round).

    With ``privacy.dp_scope: store_only`` the stored copies are the seeded noisy ones made by
    ``privacy``'s mod (a policy whose spec ``applies_store_transform`` stores them;
    ``resolve_config`` refuses the others). ``clients`` restricts the reference set to them
    (a continuation: the clients never forgotten).
    """
    mod = privacy.mod if privacy is not None else None
    store_only = mod is not None and not mod.perturb
    return PolicyEnv(
        model=setup.model,
        final_round=setup.config.training.rounds,
        seed=setup.config.seed,
        reference_set=lambda size: reference_set(setup, size, clients),
        store_transform=(lambda r, c, d: mod.privatize(r, c, d)[0])
        if store_only and mod is not None
        else None,
    )


def make_recording_policy(
    config: RunConfig, setup: Setup, privacy: PrivateTraining | None = None
) -> RecordingPolicy | DeferredPolicy:
    """Return the run's recording policy, built by its registered ``PolicySpec``."""
    return build_policy(config.history, policy_env(setup, privacy))


def records_client_values(config: RunConfig) -> bool:
    """Whether the store keeps each client's ||Δ_c|| and <Δ_c, G_t> (``HistoryRecorder``).

    Not under ``privacy.dp_scope: store_only``: the uploads are clean there, so the values
    would be noise-free in a store whose content is stated DP (docs/privacy.md).
    """
    return not (config.privacy.enabled and config.privacy.dp_scope == "store_only")


def clients_loss_samples(config: RunConfig, privacy: PrivateTraining | None) -> int | None:
    """Samples per client of the ``clients_loss`` round metric, or None if nobody reads it."""
    history = resolve_history(config.history)
    spec = POLICIES.get(history.policy)
    if spec.clients_loss_samples is not None:
        return spec.clients_loss_samples(history.options(spec.name, spec.options_type))
    return DEFAULT_LOSS_SAMPLES if privacy is not None else None


def resume_state(
    store: HistoryStore,
    policy: RecordingPolicy | DeferredPolicy,
    privacy: PrivateTraining | None,
    last: int,
    restart: tuple[int, float] | None = None,
) -> int:
    """Set the policy's and the DP schedule's state from the store; the round to train after.

    A deferred policy's open window is in memory only: the store is truncated after the round
    it can be rebuilt from (Crab: the last closed window) and the rest is re-run, bit for bit.
    ``restart``: the DP budget schedule's restart point (``PrivateTraining.resume``).
    """
    if isinstance(policy, DeferredPolicy):
        start = policy.resume_round(store)
        if start < last:
            store.truncate_after(start)
            last = start
    if privacy is not None:
        privacy.resume([store.round_scalars(r) for r in range(last + 1)], restart)
    return last


def on_cadence(
    evaluate: Callable[[Model], Mapping[str, float]], every: int, rounds: range | None
) -> Callable[[Model], dict[str, float]]:
    """Return ``evaluate`` measured on the rounds ``every`` divides and the last, else ``{}``.

    ``training.eval_every``: the test set costs a forward pass over every test example per
    round, at M = 1,000 clients and a 582k-parameter CNN several times the round's client
    training (docs/performance.md). ``rounds``: the rounds the result is called for, once each
    and in order; None (or past them): always measured. ``Model``: the global model's flat
    parameters, or a sharded run's shard models (its ensemble's metrics).
    """
    last = rounds[-1] if rounds else None
    due = iter([r % every == 0 or r == last for r in rounds or ()])

    def measured(model: Model) -> dict[str, float]:
        return dict(evaluate(model)) if next(due, True) else {}

    return measured


def training_evaluator(
    config: RunConfig,
    setup: Setup,
    privacy: PrivateTraining | None,
    clients: Collection[int] | None = None,
    rounds: range | None = None,
) -> Callable[[torch.Tensor], dict[str, Any]]:
    """Return the round evaluation of training: test metrics, server loss, the DP ledger.

    ``clients`` restricts the server loss to them (a continuation: the clients never forgotten).
    ``rounds``: the rounds the evaluation is called for, once each and in order (``run_rounds``
    calls it once per round); the test metrics are then measured on the rounds
    ``training.eval_every`` divides and on the last (None: a single model, always measured).
    The server loss and the DP ledger are every round's: a schedule or a policy reads them.
    """
    loss_samples = clients_loss_samples(config, privacy)
    test = on_cadence(setup.evaluate, config.training.eval_every, rounds)

    def evaluate(params: torch.Tensor) -> dict[str, Any]:
        out: dict[str, Any] = dict(test(params))
        if loss_samples is not None:
            out[CLIENTS_LOSS_KEY] = clients_loss(setup, params, loss_samples, clients)
        if privacy is not None:
            out.update(privacy.latest_scalars())
        return out

    return evaluate


class WallClock:
    """Round observer adding this session's training time to the store's ``wall_seconds``."""

    def __init__(self, store: HistoryStore, started: float) -> None:
        self.store = store
        self.before = store.run_meta.wall_seconds or 0.0
        self.started = started  # time.perf_counter() when this session began

    @property
    def total(self) -> float:
        """Seconds of every session so far, this one up to now."""
        return self.before + time.perf_counter() - self.started

    def on_round_end(self, record: RoundRecord) -> None:
        """Commit the running total (a kill -9 loses at most the round in flight)."""
        self.store.update_meta({"wall_seconds": self.total})


def recorded_setup(
    config: RunConfig,
    store: HistoryStore | None,
    run_dir: Path,
    *,
    model: ModelFactory | None = None,
    data: FederatedData | Mapping[str, Any] | None = None,
) -> Setup:
    """Build the setup a run's rounds train under (``store``: the run's, None for a fresh run).

    ``auto`` is pinned to the executor and device the store recorded
    (``with_recorded_executor``), and a user component that changed since the stored rounds is
    warned about: resumed and continued rounds must train on what the first ones did.
    """
    meta = None if store is None else store.run_meta
    pinned = config if meta is None else with_recorded_executor(config, meta.executor, meta.device)
    setup = build_setup(pinned, model=model, data=data)
    if meta is not None:  # resumed rounds must train on what the first ones did
        warn_changed_components(meta.components, setup.components, str(run_dir))
    return setup


@dataclass(frozen=True)
class Trained:
    """What ``train_recorded`` did: the round it trained after, and the session's clock."""

    resumed_from: int
    clock: WallClock


def train_recorded(
    run_dir: Path,
    config: RunConfig,
    setup: Setup,
    store: HistoryStore,
    privacy: PrivateTraining | None,
    policy: RecordingPolicy | DeferredPolicy,
    *,
    target: int,
    started: float,
    observers: Sequence[RoundObserver] = (),
    clients: Sequence[int] | None = None,
    trainers: RunClients | None = None,
    recorder: RecorderFactory = HistoryRecorder,
    restart: tuple[int, float] | None = None,
) -> Trained:
    """Train the run from the store's last round to ``target``, recording every round.

    Args:
        run_dir: The run directory (its ``metrics.jsonl`` is rewritten, then appended to).
        config: The run's config.
        setup: The setup to train under (DP wrapped: ``wrap_privacy``).
        store: The run's store, open for writing, holding round 0 at least.
        privacy: The DP mechanism (None without DP): its ledger is an observer.
        policy: The recording policy (its state is restored: ``resume_state``).
        target: The last round to train.
        started: ``time.perf_counter()`` when this session began (the wall clock).
        observers: Extra round observers (e.g. a progress bar).
        clients: The clients that may be sampled (default: all; a continuation: the clients
            never forgotten); the server loss is measured over them too.
        trainers: The clients that train (default: ``setup.federation``, in-process).
        recorder: Builds the observer that records each round into the store.
        restart: The DP budget schedule's restart point (``resume_state``).
    """
    last = resume_state(store, policy, privacy, store.last_round() or 0, restart)
    # metrics.jsonl is derived from the store, so a crash between the two never disagrees
    rewrite_metrics(run_dir, store)
    clock = WallClock(store, started)
    record = recorder(store, policy)
    if isinstance(record, HistoryRecorder):
        record.client_values = records_client_values(config)
        record.update_dtype = update_dtype_of(config.history.encoding)
    sharding = setup.sharding()
    if sharding is not None and sharding.ensemble is not None:  # a test pass per shard
        sharding = replace(
            sharding,
            ensemble=on_cadence(
                sharding.ensemble, config.training.eval_every, range(last + 1, target + 1)
            ),
        )
    run_rounds(
        setup.federation if trainers is None else trainers,
        setup.aggregator,
        store.read_model(last),
        num_rounds=target,
        start_round=last + 1,
        client_ids=clients,
        participation=config.training.participation,
        sampler=sampler_of(config),  # frozen K: never recomputed from who remains
        sharding=sharding,
        shard_params=None
        if sharding is None or last == 0
        else {s: store.read_shard_model(last, s) for s in sharding.plan.shards},
        join_rounds=setup.join_rounds,
        evaluate=training_evaluator(config, setup, privacy, clients, range(last + 1, target + 1)),
        observers=[
            record,
            clock,
            MetricsWriter(run_dir / METRICS_FILE),
            *([privacy] if privacy is not None else []),
            *observers,
        ],
    )
    return Trained(resumed_from=last, clock=clock)
