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

import time
import warnings
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from fedunlearn.config import PrivacyConfig, RunConfig, dump_config
from fedunlearn.data import FederatedData
from fedunlearn.errors import ConfigError, HistoryCorruptError, HistoryError
from fedunlearn.fl.aggregators import Aggregator
from fedunlearn.fl.engine import RoundObserver
from fedunlearn.fl.federation import Federation
from fedunlearn.fl.threads import run_threads
from fedunlearn.history.policy import encoding_meta
from fedunlearn.history.store import FILE_NAME, LOCK_NAME, HistoryStore, RoundEntry, WriterLock
from fedunlearn.models.registry import ModelFactory
from fedunlearn.privacy.calibrate import gradient_clip_norm, pilot_clip_norm
from fedunlearn.privacy.training import PrivateTraining
from fedunlearn.runs.assembly import resolve_config
from fedunlearn.runs.rounds import (
    make_recording_policy,
    policy_env,
    recorded_setup,
    records_client_values,
    resume_state,
    train_recorded,
    training_evaluator,
)
from fedunlearn.runs.rundir import (
    CONFIG_FILE,
    HISTORY_DIR,
    METRICS_FILE,
    PRIVACY_FILE,
    SUMMARY_FILE,
    config_differences,
    headline_privacy,
    holds_run,
    run_privacy,
    same_run_config,
    stored_config,
    write_json,
    write_text_atomic,
)
from fedunlearn.runs.setup import Setup

__all__ = [
    "federation_meta",
    "make_recording_policy",  # fedunlearn.runs.rounds, named here for older imports
    "policy_env",
    "records_client_values",
    "resolve_clip_norm",
    "resume_state",
    "train_run",
    "training_evaluator",
    "upload_counts",
    "wrap_privacy",
]


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


def federation_meta(config: RunConfig, fed: Federation) -> dict[str, Any]:
    """Return the store metadata of every recorded run, in-process or by Flower.

    The config, the malicious clients, the model and client sizes, the history policy, and the
    server's torch thread count (unlearning and a replay of it run at the same count).
    """
    return {
        "config": config.model_dump(mode="json"),
        "malicious": sorted(fed.malicious),
        "num_params": fed.num_params,
        "client_sizes": {str(c): fed.num_samples(c) for c in fed.client_ids},
        "history_policy": config.history.policy,
        "history_every": config.history.every,
        **encoding_meta(config.history.encoding),
        "torch_threads": torch.get_num_threads(),
    }


def _store_meta(config: RunConfig, setup: Setup) -> dict[str, Any]:
    fed = setup.federation
    return {
        **federation_meta(config, fed),
        "executor": fed.executor.name,  # what 'auto' resolved to (with_recorded_executor)
        "device": str(fed.device),  # likewise for training.device
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


def upload_counts(store: HistoryStore, rounds: int) -> dict[str, int]:
    """Client uploads over rounds 1..``rounds`` by status: accepted, rejected, missing."""
    counts = Counter(rec.status for r in range(1, rounds + 1) for rec in store.client_records(r))
    return {status: counts.get(status, 0) for status in ("accepted", "rejected", "missing")}


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
            setup = recorded_setup(config, store, run_dir, model=model, data=data)
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
    if store.last_round() is None:
        store.write_round(
            RoundEntry(
                round=0,
                global_model=setup.initial_params,
                aggregate=None,
                updates={},
                clients=[],
                scalars=training_evaluator(config, setup, privacy)(setup.initial_params),
            )
        )
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
    trained = train_recorded(
        run_dir,
        config,
        setup,
        store,
        privacy,
        policy,
        target=config.training.rounds,
        started=started,
        observers=observers,
    )
    session_seconds = time.perf_counter() - started
    wall_seconds = trained.clock.before + session_seconds
    store.update_meta({"wall_seconds": wall_seconds})
    summary: dict[str, Any] = {
        "rounds": config.training.rounds,
        "resumed_from_round": trained.resumed_from if resume else None,
        "final_metrics": store.round_scalars(config.training.rounds),
        "malicious_clients": sorted(setup.federation.malicious),
        "uploads": upload_counts(store, config.training.rounds),
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
