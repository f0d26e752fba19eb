"""Train a run directory with history recording, resume it, and repair a damaged one.

Order of a run directory's writes: the writer lock (``history/history.lock``) is taken before
anything is written, so a second ``train`` into the same directory is refused without touching
it; then the store (whose metadata keeps the resolved config) and round 0; then ``config.yaml``,
atomically. Until round 0 is committed nothing but the empty directories and the lock file
exists, so a run that fails early (missing data) leaves no half-written run behind.

Determinism: every random choice derives from (seed, purpose, round, client), so the same config
gives bit-identical models on the same machine, and a resumed run equals an uninterrupted one.
Float reductions also depend on torch's intra-op thread count, so the store records the count a
run was trained with and a resume runs with that count (restoring the caller's afterwards, with
a warning when they differ). A deferred recording policy (Crab's windows, FedADP's stages) holds
its open window in memory only, so a resume drops the rounds after the last closed window and
re-runs them (bit-identically). A resume first checks every stored payload (one read of the
store: about 5 s for the 2 GB paper-scale history, docs/performance.md); with ``repair`` it
drops the first damaged round and everything after it and retrains them, reaching the model of
an uninterrupted run. With ``privacy.enabled`` training runs on a wrapper of the federation
with the mechanism (``wrap_privacy``; the federation itself is unchanged); the DP ledger is
committed in each round's scalars and summarised in ``privacy.json``.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from fedunlearn.config import PrivacyConfig, RunConfig, dump_config
from fedunlearn.data import FederatedData
from fedunlearn.errors import ConfigError, HistoryCorruptError, HistoryError
from fedunlearn.fl.aggregators import Aggregator
from fedunlearn.fl.engine import RoundObserver, run_rounds
from fedunlearn.fl.federation import Federation
from fedunlearn.fl.metrics import CLIENTS_LOSS_KEY
from fedunlearn.fl.records import RoundRecord
from fedunlearn.fl.threads import run_threads
from fedunlearn.history.policy import (
    POLICIES,
    DeferredPolicy,
    HistoryRecorder,
    PolicyEnv,
    RecordingPolicy,
    build_policy,
    resolve_history,
)
from fedunlearn.history.store import FILE_NAME, LOCK_NAME, HistoryStore, RoundEntry, WriterLock
from fedunlearn.models.registry import ModelFactory
from fedunlearn.privacy.calibrate import gradient_clip_norm, pilot_clip_norm
from fedunlearn.privacy.training import PrivateTraining
from fedunlearn.runs.assembly import resolve_config
from fedunlearn.runs.components import warn_changed_components
from fedunlearn.runs.rundir import (
    CONFIG_FILE,
    HISTORY_DIR,
    METRICS_FILE,
    PRIVACY_FILE,
    SUMMARY_FILE,
    MetricsWriter,
    config_differences,
    headline_privacy,
    holds_run,
    run_privacy,
    same_run_config,
    stored_config,
    stored_metrics_line,
    write_json,
    write_text_atomic,
)
from fedunlearn.runs.setup import (
    DEFAULT_LOSS_SAMPLES,
    Setup,
    build_setup,
    clients_loss,
    reference_set,
    sampler_of,
    with_recorded_executor,
)

__all__ = [
    "make_recording_policy",
    "policy_env",
    "resolve_clip_norm",
    "train_run",
    "wrap_privacy",
]


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


def _clients_loss_samples(config: RunConfig, privacy: PrivateTraining | None) -> int | None:
    """Samples per client of the ``clients_loss`` round metric, or None if nobody reads it."""
    history = resolve_history(config.history)
    spec = POLICIES.get(history.policy)
    if spec.clients_loss_samples is not None:
        return spec.clients_loss_samples(history.options(spec.name, spec.options_type))
    return DEFAULT_LOSS_SAMPLES if privacy is not None else None


def wrap_privacy(
    config: RunConfig, setup: Setup, clip_norm: float | None = None, noise_salt: int = 0
) -> tuple[PrivateTraining | None, Setup]:
    """Resolve the clip norm and return the run's DP mechanism with a setup that trains under it.

    ``privacy.mechanism: dp_sgd`` wraps the federation with DP-SGD as its local training (C: the
    median per-example gradient norm at M_0 if ``auto``); ``client_update`` wraps it with the
    clip-and-noise update mod (S: the pilot's median update norm if ``auto``). ``setup`` and its
    federation are left as they are (a wrapper, never a change in place): unlearning sessions
    build their own federation without either. Without DP, ``(None, setup)``; otherwise the
    caller closes the returned setup's federation as well as its own. ``clip_norm`` (the run's
    stored one) skips the ``auto`` calibration (a continuation: its pilot would train, and its
    median read, every client's data, forgotten ones included). ``noise_salt``: the noise
    draws' salt (``PrivateTraining``).
    """
    cfg = config.privacy
    if not cfg.enabled:
        return None, setup
    if clip_norm is None:
        clip_norm = resolve_clip_norm(cfg, setup.federation, setup.aggregator, setup.initial_params)
    privacy = PrivateTraining(
        cfg, seed=config.seed, clip_norm=float(clip_norm), noise_salt=noise_salt
    )
    return privacy, replace(setup, federation=privacy.wrap(setup.federation))


def resolve_clip_norm(
    config: PrivacyConfig,
    federation: Federation,
    aggregator: Aggregator,
    initial_params: torch.Tensor,
    clients: Collection[int] | None = None,
) -> float:
    """Return C (``dp_sgd``) or S (``client_update``): the configured number, or ``auto``'s.

    ``auto``: the median per-example gradient norm at M_0 (``dp_sgd``) or the median upload
    norm of a no-DP pilot from M_0 (``client_update``), over ``clients`` (default: every
    client of ``federation``). After a forget, a DP step (a continued round, a DP release)
    passes the remaining clients: the clip norm is then what the run would have chosen without
    the forgotten ones, and no forgotten client's data chooses it (issue 40).
    """
    if config.clip_norm != "auto":
        return float(config.clip_norm)
    ids = sorted(federation.client_ids if clients is None else clients)
    if config.mechanism == "dp_sgd":
        data = {c: federation.client_data[c] for c in ids}
        return float(gradient_clip_norm(federation.model, initial_params, data)[0])
    norm, _ = pilot_clip_norm(
        federation, aggregator, initial_params, rounds=config.pilot_rounds, client_ids=ids
    )
    return float(norm)


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


def training_evaluator(
    config: RunConfig,
    setup: Setup,
    privacy: PrivateTraining | None,
    clients: Collection[int] | None = None,
) -> Callable[[torch.Tensor], dict[str, Any]]:
    """Return the round evaluation of training: test metrics, server loss, the DP ledger.

    ``clients`` restricts the server loss to them (a continuation: the clients never forgotten).
    """
    loss_samples = _clients_loss_samples(config, privacy)

    def evaluate(params: torch.Tensor) -> dict[str, Any]:
        out: dict[str, Any] = dict(setup.evaluate(params))
        if loss_samples is not None:
            out[CLIENTS_LOSS_KEY] = clients_loss(setup, params, loss_samples, clients)
        if privacy is not None:
            out.update(privacy.latest_scalars())
        return out

    return evaluate


class _WallClock:
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


def _check_resumable(
    config: RunConfig, run_dir: Path, store: HistoryStore, repair: bool
) -> dict[str, Any] | None:
    """Refuse a resume that would not continue this run; drop damaged rounds with ``repair``.

    Returns:
        What ``repair`` dropped (None if nothing).
    """
    stored = stored_config(store)
    if stored is not None and not same_run_config(stored, config):
        raise ConfigError(
            f"the config differs from the one {run_dir} was trained with "
            f"({config_differences(config, stored)}; given vs stored); resume with "
            f"'fedunlearn train {run_dir / CONFIG_FILE} --out {run_dir} --resume'"
        )
    if store.generation() or store.run_meta.continuation:  # a living run (lifecycle.py)
        raise ConfigError(
            f"{run_dir} had results applied or rounds added with --continue, so it is no longer "
            f"the run the config describes; finish or extend it with 'fedunlearn train "
            f"--continue {run_dir}' instead of --resume"
        )
    result = store.check(full=True)
    if result.ok:
        return None
    first = result.first_bad_round
    where = f"{store.file}: {'; '.join(result.problems[:3])}"
    if not repair:
        how = (
            f"rerun with --repair to drop round {first} and later and retrain them"
            if first is not None
            else "restore it from a backup"
        )
        raise HistoryCorruptError(f"{where}; nothing was changed; {how}.")
    if first is None:
        raise HistoryCorruptError(
            f"{where}; --repair cannot fix damage that is not tied to a round; nothing was "
            "changed. Restore the file from a backup, or start a new run."
        )
    forgotten = sorted({e.client_id for e in store.forget_records()})
    if forgotten:
        raise HistoryCorruptError(
            f"{where}; --repair would retrain rounds {first}.. and store the updates of the "
            f"forgotten client(s) {', '.join(map(str, forgotten))} again, so it is refused; "
            "nothing was changed. Restore the file from a backup."
        )
    store.truncate_after(first - 1)
    return {"dropped_from_round": first, "problems": list(result.problems)}


def _store_meta(config: RunConfig, setup: Setup) -> dict[str, Any]:
    fed = setup.federation
    return {
        "config": config.model_dump(mode="json"),
        "malicious": sorted(fed.malicious),
        "num_params": fed.num_params,
        "client_sizes": {str(c): fed.num_samples(c) for c in fed.client_ids},
        "history_policy": config.history.policy,
        "history_every": config.history.every,
        "torch_threads": torch.get_num_threads(),
        "executor": fed.executor.name,  # what 'auto' resolved to (with_recorded_executor)
        "wall_seconds": 0.0,
        **({"components": setup.components} if setup.components else {}),
    }


#: What a fresh run writes in its directory before its first trained round (``_discard``).
_RUN_FILES = (CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, PRIVACY_FILE)


def _untrained(store: HistoryStore | None) -> bool:
    """Whether a fresh run's store holds no trained round (nothing, or round 0 only)."""
    try:
        return store is None or not store.last_round()
    except HistoryError:  # unreadable: whatever it holds, no trained round can be read back
        return True


def _discard(run_dir: Path, history_dir: Path, made: list[Path], store_made: bool) -> None:
    """Remove what a fresh run that failed before its first trained round wrote.

    The store and the run's files only if this call created the store (another process's
    run is never touched); the lock file and the directories only if this call made them,
    and only when empty. Called while the writer lock is still held.
    """
    if store_made:
        for suffix in ("", "-wal", "-shm"):
            (history_dir / (FILE_NAME + suffix)).unlink(missing_ok=True)
        for name in _RUN_FILES:
            (run_dir / name).unlink(missing_ok=True)
    if history_dir in made:
        (history_dir / LOCK_NAME).unlink(missing_ok=True)
    for directory in reversed(made):  # deepest first
        try:
            directory.rmdir()
        except OSError:  # not empty (or gone): leave it
            pass


def train_run(
    config: RunConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    repair: bool = False,
    observers: Sequence[RoundObserver] = (),
    model: ModelFactory | None = None,
    data: FederatedData | Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Train a run into ``run_dir`` with history recording and return its summary.

    Args:
        config: The run configuration (assembled here: ``resolve_config``).
        run_dir: Output directory (created).
        resume: Continue a run that was interrupted; its stored config must equal ``config``.
        repair: With ``resume``: if a stored payload is damaged, drop its round and every later
            one and retrain them (without it, a damaged store is refused).
        observers: Extra round observers (e.g. a progress bar).
        model: A model factory ``(input_shape, num_classes, **options) -> nn.Module`` used
            instead of the config's model (recorded in the run; ``UnlearnSession`` then needs
            it again: ``UnlearnSession(run_dir, model=...)``).
        data: The federation's data (``fedunlearn.data.FederatedData`` or the plain mapping)
            used instead of the config's (recorded by its digest; pass it to the session too).

    Raises:
        ConfigError: ``run_dir`` already holds a run and ``resume`` is False, holds none and
            ``resume`` is True, the stored config differs from ``config``, ``repair`` is
            given without ``resume``, or a policy's options are invalid (``resolve_config``).
        UnknownNameError: The config names a policy or schedule no plugin provides.
        HistoryError: Another process writes ``run_dir``.
        HistoryCorruptError: The store is damaged (resume without ``repair``), or damaged in a
            way ``repair`` cannot fix.
        OSError: ``run_dir`` cannot be created or written.
    """
    started = time.perf_counter()
    config = resolve_config(config)  # before anything is written
    run_dir = Path(run_dir)
    history_dir = run_dir / HISTORY_DIR
    if repair and not resume:
        raise ConfigError("--repair works on an existing run: pass --resume --repair")
    if resume and not (history_dir / FILE_NAME).exists():
        raise ConfigError(f"{run_dir} holds no run to resume; drop --resume to start one")
    already = (
        f"{run_dir} already holds a run; pass --resume to continue it, or choose another --out"
    )
    if not resume and holds_run(run_dir):
        raise ConfigError(already)
    made = [d for d in (run_dir, history_dir) if not d.exists()]  # removed again on failure
    history_dir.mkdir(parents=True, exist_ok=True)
    lock: WriterLock | None = WriterLock.acquire(history_dir)  # before anything is written
    store: HistoryStore | None = None
    store_made = False
    setup: Setup | None = None
    discard = False
    try:
        repaired = None
        if resume:
            store, lock = HistoryStore.open(history_dir, lock=lock), None
            repaired = _check_resumable(config, run_dir, store, repair)
        elif holds_run(run_dir):  # written between the first look and the lock
            raise ConfigError(already)
        meta = None if store is None else store.run_meta
        threads = None if meta is None else meta.torch_threads
        with run_threads(threads, purpose="the resume"):
            recorded = None if meta is None else meta.executor
            setup = build_setup(with_recorded_executor(config, recorded), model=model, data=data)
            if store is not None:  # resumed rounds must train on what the first ones did
                warn_changed_components(
                    None if meta is None else meta.components, setup.components, str(run_dir)
                )
            if store is None:
                store, lock = (
                    HistoryStore.create(history_dir, _store_meta(config, setup), lock=lock),
                    None,
                )
                store_made = True
            privacy, private = wrap_privacy(config, setup)  # DP on a wrapper, for training
            try:
                summary = _train(
                    config, run_dir, private, store, resume, observers, started, privacy
                )
            finally:
                if private is not setup:
                    private.close()
        if repaired is not None:
            summary["repaired"] = repaired
        write_json(run_dir / SUMMARY_FILE, summary)
        return summary
    except BaseException:
        # a fresh run that failed before its first trained round (a config the engine cannot
        # run, missing data, an interrupt) leaves no run directory behind
        discard = not resume and _untrained(store)
        raise
    finally:
        if setup is not None:
            setup.close()
        held = store.close_keeping_lock() if store is not None else lock  # held while discarding
        if discard:
            _discard(run_dir, history_dir, made, store_made)
        if held is not None:
            held.release()


def _train(
    config: RunConfig,
    run_dir: Path,
    setup: Setup,
    store: HistoryStore,
    resume: bool,
    observers: Sequence[RoundObserver],
    started: float,
    privacy: PrivateTraining | None,
) -> dict[str, Any]:
    """Train from the store's last round to the end under ``setup`` (DP wrapped); the summary."""
    evaluate = training_evaluator(config, setup, privacy)
    clock = _WallClock(store, started)
    last = store.last_round()
    if last is None:
        store.write_round(
            RoundEntry(
                round=0,
                global_model=setup.initial_params,
                aggregate=None,
                updates={},
                clients=[],
                scalars=evaluate(setup.initial_params),
            )
        )
        last = 0
    # config.yaml after round 0, atomically: the store's copy is the reference (resume rewrites
    # a config.yaml that is missing or was changed, since the config equals the store's copy)
    config_text = dump_config(config)
    config_path = run_dir / CONFIG_FILE
    if not config_path.exists() or config_path.read_text() != config_text:
        if resume:
            warnings.warn(
                f"{config_path} was missing or did not match the run's stored config; "
                "rewrote it from the store",
                stacklevel=3,
            )
        write_text_atomic(config_path, config_text)
    policy = make_recording_policy(config, setup, privacy)
    last = resume_state(store, policy, privacy, last)
    params = store.read_model(last)
    # metrics.jsonl is derived from the store, so a crash between the two never disagrees
    with (run_dir / METRICS_FILE).open("w") as fh:
        for r in range(1, last + 1):
            fh.write(json.dumps(stored_metrics_line(store, r)) + "\n")
    recorder = HistoryRecorder(store, policy, client_values=records_client_values(config))
    sharding = setup.sharding()
    shard_params = (
        None
        if sharding is None or last == 0
        else {s: store.read_shard_model(last, s) for s in sharding.plan.shards}
    )
    params = run_rounds(
        setup.federation,
        setup.aggregator,
        params,
        num_rounds=config.training.rounds,
        start_round=last + 1,
        participation=config.training.participation,
        sampler=sampler_of(config),
        sharding=sharding,
        shard_params=shard_params,
        join_rounds=setup.join_rounds,
        evaluate=evaluate,
        observers=[
            recorder,
            clock,
            MetricsWriter(run_dir / METRICS_FILE),
            *([privacy] if privacy is not None else []),
            *observers,
        ],
    )
    session_seconds = time.perf_counter() - started
    wall_seconds = clock.before + session_seconds
    store.update_meta({"wall_seconds": wall_seconds})
    summary: dict[str, Any] = {
        "rounds": config.training.rounds,
        "resumed_from_round": last if resume else None,
        "final_metrics": store.round_scalars(config.training.rounds),
        "malicious_clients": sorted(setup.federation.malicious),
        "num_params": setup.federation.num_params,
        "stored_bytes": store.stored_bytes(),
        "file_bytes": store.file_bytes(),
        "wall_seconds": wall_seconds,
        "session_wall_seconds": session_seconds,
        "torch_threads": torch.get_num_threads(),
        "executor": setup.federation.executor.name,
        "device": str(setup.federation.device),
    }
    if privacy is not None:
        ledger = run_privacy(config, store)
        write_json(run_dir / PRIVACY_FILE, ledger)
        summary["privacy"] = headline_privacy(ledger)
    return summary
