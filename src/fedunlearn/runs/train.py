"""Train a run directory with history recording, and resume it.

Determinism: every random choice derives from (seed, purpose, round, client), so the same config
gives bit-identical models on the same machine, and a resumed run equals an uninterrupted one.
A deferred recording policy (Crab's windows, FedADP's stages) holds its open window in memory
only, so a resume drops the rounds after the last closed window and re-runs them
(bit-identically). With ``privacy.enabled`` the clip-and-noise mod is attached to the federation
for training only (``attach_privacy``); the DP ledger is committed in each round's scalars and
summarised in ``privacy.json``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from fedunlearn.config import RunConfig, dump_config
from fedunlearn.errors import ConfigError
from fedunlearn.fl.engine import RoundObserver, run_rounds
from fedunlearn.fl.metrics import CLIENTS_LOSS_KEY
from fedunlearn.history.policy import (
    POLICIES,
    DeferredPolicy,
    HistoryRecorder,
    PolicyEnv,
    RecordingPolicy,
    build_policy,
)
from fedunlearn.history.store import HistoryStore, RoundEntry
from fedunlearn.privacy.calibrate import pilot_clip_norm
from fedunlearn.privacy.training import PrivateTraining
from fedunlearn.runs.rundir import (
    CONFIG_FILE,
    HISTORY_DIR,
    METRICS_FILE,
    PRIVACY_FILE,
    SUMMARY_FILE,
    MetricsWriter,
    metrics_line,
    run_privacy,
    write_json,
)
from fedunlearn.runs.setup import (
    DEFAULT_LOSS_SAMPLES,
    Setup,
    build_setup,
    clients_loss,
    reference_set,
)

__all__ = ["attach_privacy", "make_recording_policy", "policy_env", "train_run"]


def policy_env(setup: Setup, privacy: PrivateTraining | None = None) -> PolicyEnv:
    """Return what the run's recording policy may ask for (model, reference set, last round).

    With ``privacy.dp_scope: store_only`` the stored copies are the seeded noisy ones made by
    ``privacy``'s mod.
    """
    store_only = privacy is not None and not privacy.mod.perturb
    return PolicyEnv(
        model=setup.model,
        final_round=setup.config.training.rounds,
        seed=setup.config.seed,
        reference_set=lambda size: reference_set(setup, size),
        store_transform=(lambda r, c, d: privacy.mod.privatize(r, c, d)[0])
        if store_only and privacy is not None
        else None,
    )


def make_recording_policy(
    config: RunConfig, setup: Setup, privacy: PrivateTraining | None = None
) -> RecordingPolicy | DeferredPolicy:
    """Return the run's recording policy, built by its registered ``PolicySpec``."""
    return build_policy(config.history, policy_env(setup, privacy))


def _clients_loss_samples(config: RunConfig, privacy: PrivateTraining | None) -> int | None:
    """Samples per client of the ``clients_loss`` round metric, or None if nobody reads it."""
    spec = POLICIES.get(config.history.policy)
    if spec.clients_loss_samples is not None:
        return spec.clients_loss_samples(config.history.options(spec.name))
    return DEFAULT_LOSS_SAMPLES if privacy is not None else None


def attach_privacy(config: RunConfig, setup: Setup) -> PrivateTraining | None:
    """Resolve S (pilot if ``auto``) and attach the DP mod to the federation, for training.

    Unlearning sessions build the federation without it (fresh updates are not noised unless
    a method asks), so call this only to train.
    """
    cfg = config.privacy
    if not cfg.enabled:
        return None
    if cfg.clip_norm == "auto":
        clip_norm, _ = pilot_clip_norm(
            setup.federation, setup.aggregator, setup.initial_params, rounds=cfg.pilot_rounds
        )
    else:
        clip_norm = float(cfg.clip_norm)
    privacy = PrivateTraining(cfg, seed=config.seed, clip_norm=clip_norm)
    setup.federation.update_mods = (*setup.federation.update_mods, privacy.mod)
    return privacy


def training_evaluator(
    config: RunConfig, setup: Setup, privacy: PrivateTraining | None
) -> Callable[[torch.Tensor], dict[str, Any]]:
    """Return the round evaluation of training: test metrics, server loss, the DP ledger."""
    loss_samples = _clients_loss_samples(config, privacy)

    def evaluate(params: torch.Tensor) -> dict[str, Any]:
        out: dict[str, Any] = dict(setup.evaluate(params))
        if loss_samples is not None:
            out[CLIENTS_LOSS_KEY] = clients_loss(setup, params, loss_samples)
        if privacy is not None:
            out.update(privacy.latest_scalars())
        return out

    return evaluate


def train_run(
    config: RunConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    observers: Sequence[RoundObserver] = (),
) -> dict[str, Any]:
    """Train a run into ``run_dir`` with history recording and return its summary.

    Args:
        config: The run configuration.
        run_dir: Output directory (created).
        resume: Continue a run that was interrupted; its config must equal ``config``.
        observers: Extra round observers (e.g. a progress bar).

    Raises:
        ConfigError: if ``run_dir`` already holds a run and ``resume`` is False, or the stored
            config differs from ``config`` when resuming.
    """
    run_dir = Path(run_dir)
    history_dir = run_dir / HISTORY_DIR
    config_text = dump_config(config)
    started = time.perf_counter()
    if resume:
        if not history_dir.exists():
            raise ConfigError(f"{run_dir} holds no run to resume; drop --resume to start one")
        stored_text = (run_dir / CONFIG_FILE).read_text()
        if stored_text != config_text:
            raise ConfigError(
                f"the config differs from the one {run_dir} was trained with; resume with "
                f"'fedunlearn train {run_dir / CONFIG_FILE} --out {run_dir} --resume'"
            )
        store = HistoryStore.open(history_dir, writable=True)
    else:
        if history_dir.exists():
            raise ConfigError(
                f"{run_dir} already holds a run; pass --resume to continue it or choose "
                "another --out"
            )
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / CONFIG_FILE).write_text(config_text)
        store = None

    setup = build_setup(config)
    try:
        privacy = attach_privacy(config, setup)
        evaluate = training_evaluator(config, setup, privacy)
        if store is None:
            store = HistoryStore.create(
                history_dir,
                meta={
                    "config": config.model_dump(mode="json"),
                    "malicious": sorted(setup.federation.malicious),
                    "num_params": setup.federation.num_params,
                    "client_sizes": {
                        str(c): setup.federation.num_samples(c) for c in setup.federation.client_ids
                    },
                    "history_policy": config.history.policy,
                    "history_every": config.history.every,
                },
            )
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
        policy = make_recording_policy(config, setup, privacy)
        if isinstance(policy, DeferredPolicy):
            # a deferred policy's open window is in memory only: restart where it can be
            # rebuilt from the store (Crab: after the last closed window) and re-run the rest
            start = policy.resume_round(store)
            if start < last:
                store.truncate_after(start)
                last = start
        if privacy is not None:
            privacy.resume([store.round_scalars(r) for r in range(last + 1)])
        params = store.read_model(last)
        # metrics.jsonl is derived from the store, so a crash between the two never disagrees
        with (run_dir / METRICS_FILE).open("w") as fh:
            for r in range(1, last + 1):
                fh.write(json.dumps(metrics_line(r, store.round_scalars(r))) + "\n")
        recorder = HistoryRecorder(store, policy)
        params = run_rounds(
            setup.federation,
            setup.aggregator,
            params,
            num_rounds=config.training.rounds,
            start_round=last + 1,
            participation=config.training.participation,
            join_rounds=setup.join_rounds,
            evaluate=evaluate,
            observers=[
                recorder,
                MetricsWriter(run_dir / METRICS_FILE),
                *([privacy] if privacy is not None else []),
                *observers,
            ],
        )
        final = store.round_scalars(config.training.rounds)
        summary = {
            "rounds": config.training.rounds,
            "resumed_from_round": last if resume else None,
            "final_metrics": final,
            "malicious_clients": sorted(setup.federation.malicious),
            "num_params": setup.federation.num_params,
            "stored_bytes": store.stored_bytes(),
            "file_bytes": store.file_bytes(),
            "wall_seconds": time.perf_counter() - started,
            "executor": setup.federation.executor.name,
        }
        if privacy is not None:
            ledger = run_privacy(config, store)
            write_json(run_dir / PRIVACY_FILE, ledger)
            summary["privacy"] = {
                k: ledger[k] for k in ("dp_scope", "clip_norm", "total_epsilon", "delta")
            }
        write_json(run_dir / SUMMARY_FILE, summary)
        return summary
    finally:
        setup.close()
        if store is not None:
            store.close()


