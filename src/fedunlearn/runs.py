"""Run directories: build a federation from a config, train it with history recording, resume.

A run directory holds ``config.yaml`` (the resolved config), ``history/`` (the store: M_0, every
round's global model and aggregate, the client updates the policy keeps, every client's outcome
and the round metrics), ``metrics.jsonl`` (one line per round, regenerated from the store on
resume) and ``summary.json`` (written when training finishes).

Determinism: every random choice derives from (seed, purpose, round, client), so the same config
gives bit-identical models on the same machine, and a resumed run equals an uninterrupted one.
With ``history.policy: crab`` the open selection window is held in memory only, so a resume
drops the rounds after the last closed window and re-runs them (bit-identically); so does
``history.policy: fedadp`` with its open stage. With ``privacy.enabled`` the clip-and-noise mod is
attached to the federation for training only (``attach_privacy``), the DP ledger is committed in
each round's scalars and summarised in ``privacy.json`` (FedADP spec §3).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from fedunlearn.config import RunConfig, dump_config, load_config
from fedunlearn.data import Dataset, load_dataset, partition
from fedunlearn.errors import ConfigError, HistoryError
from fedunlearn.fl.aggregators import Aggregator, make_aggregator
from fedunlearn.fl.attacks import (
    Trigger,
    UpdateAttack,
    backdoor_data,
    choose_malicious,
    label_flip_data,
)
from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.engine import RoundObserver, run_rounds
from fedunlearn.fl.federation import Federation, UpdateMod
from fedunlearn.fl.metrics import accuracy_and_loss, backdoor_success_rate, predict_logits
from fedunlearn.fl.records import ClientData, RoundRecord
from fedunlearn.fl.seeding import derive_seed, torch_generator
from fedunlearn.history.crab import CrabPolicy, ReferenceScorer
from fedunlearn.history.fedadp import LOSS_KEY, FedADPPolicy
from fedunlearn.history.policy import (
    DeferredPolicy,
    HistoryRecorder,
    RecordingPolicy,
    make_policy,
)
from fedunlearn.history.store import HistoryStore, RoundEntry
from fedunlearn.models import build_model, get_flat_params
from fedunlearn.privacy.calibrate import gradient_clip_norm, pilot_clip_norm
from fedunlearn.privacy.ledger import privacy_summary
from fedunlearn.privacy.training import PrivateTraining

HISTORY_DIR = "history"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
PRIVACY_FILE = "privacy.json"
CONFIG_FILE = "config.yaml"


@dataclass
class Setup:
    """Everything a run's config determines, before any training."""

    config: RunConfig
    dataset: Dataset
    model: nn.Module
    initial_params: torch.Tensor
    federation: Federation
    aggregator: Aggregator
    x_test: torch.Tensor
    y_test: torch.Tensor
    trigger: Trigger | None
    poisoned_originals: dict[int, ClientData]

    def clean_data(self, client_id: int) -> ClientData:
        """Return a client's data before poisoning (its true labels, no trigger)."""
        return self.poisoned_originals.get(client_id, self.federation.client_data[client_id])

    def evaluate(self, params: torch.Tensor) -> dict[str, float]:
        """Return test accuracy, test loss and (with a backdoor attack) the backdoor ASR."""
        acc, loss = accuracy_and_loss(self.model, params, self.x_test, self.y_test)
        out = {"test_accuracy": acc, "test_loss": loss}
        if self.trigger is not None:
            out["backdoor_asr"] = backdoor_success_rate(
                self.model,
                params,
                self.x_test,
                self.y_test,
                self.trigger,
                self.config.attack.target_label,
            )
        return out

    def close(self) -> None:
        """Stop the federation's worker processes."""
        self.federation.close()


def _subsample(x: np.ndarray, y: np.ndarray, limit: int | None, seed: int) -> tuple:
    if limit is None or limit >= len(y):
        return x, y
    idx = np.sort(np.random.default_rng(seed).choice(len(y), size=limit, replace=False))
    return x[idx], y[idx]


def build_setup(config: RunConfig) -> Setup:
    """Load data, partition it, poison the malicious clients and build the federation."""
    cfg = config
    dataset = load_dataset(cfg.data.dataset, data_dir=cfg.data.data_dir, **cfg.data.options)
    x_train, y_train = _subsample(
        dataset.x_train,
        dataset.y_train,
        cfg.data.max_train_samples,
        derive_seed(cfg.seed, "partition", 1),
    )
    x_test, y_test = _subsample(
        dataset.x_test,
        dataset.y_test,
        cfg.data.max_test_samples,
        derive_seed(cfg.seed, "partition", 2),
    )
    if cfg.attack.kind != "none" and cfg.attack.target_label >= dataset.num_classes:
        raise ConfigError(
            f"attack.target_label {cfg.attack.target_label} is not a class of "
            f"{dataset.name} (0..{dataset.num_classes - 1})"
        )
    parts = partition(
        y_train,
        cfg.data.num_clients,
        cfg.data.partition,
        seed=derive_seed(cfg.seed, "partition", 0),
        alpha=cfg.data.alpha,
        bias=cfg.data.bias,
        shards_per_client=cfg.data.shards_per_client,
    )
    x_all, y_all = torch.from_numpy(np.ascontiguousarray(x_train)), torch.from_numpy(y_train)
    client_data = {c: ClientData(x_all[idx], y_all[idx]) for c, idx in enumerate(parts)}

    malicious = choose_malicious(
        cfg.data.num_clients, cfg.attack.num_malicious, derive_seed(cfg.seed, "attack", 0)
    )
    trigger: Trigger | None = None
    mods: list[UpdateMod] = []
    atk = cfg.attack
    originals: dict[int, ClientData] = {}
    for cid in sorted(malicious):
        if atk.kind in ("backdoor", "label_flip"):
            originals[cid] = client_data[cid]
        gen = torch_generator(derive_seed(cfg.seed, "attack", 1, cid))
        if atk.kind == "backdoor":
            trigger = Trigger(atk.trigger_size)
            client_data[cid] = backdoor_data(
                client_data[cid], trigger, atk.target_label, atk.poison_fraction, gen
            )
        elif atk.kind == "label_flip":
            client_data[cid] = label_flip_data(
                client_data[cid], dataset.num_classes, atk.poison_fraction, gen
            )
    if atk.kind in ("trim_random", "fang_trim"):
        mods.append(
            UpdateAttack(
                atk.kind,
                malicious,
                derive_seed(cfg.seed, "attack", 2),
                rho=atk.rho,
                sigma=atk.sigma,
                p_noise=atk.p_noise,
                fang_b=atk.fang_b,
            )
        )

    options: dict[str, Any] = {}
    if cfg.model.name == "mlp":
        options["hidden"] = tuple(cfg.model.hidden)
    if cfg.model.name == "textcnn":
        options["vocab_size"] = int(dataset.meta["vocab_size"])
    model = build_model(
        cfg.model.name,
        dataset.input_shape,
        dataset.num_classes,
        seed=derive_seed(cfg.seed, "model"),
        **options,
    )
    tr = cfg.training
    spec = LocalTrainingSpec(
        epochs=tr.local_epochs,
        lr=tr.lr,
        batch_size=tr.batch_size,
        momentum=tr.momentum,
        weight_decay=tr.weight_decay,
    )
    federation = Federation(
        model,
        client_data,
        spec,
        seed=cfg.seed,
        malicious=malicious,
        update_mods=mods,
        executor=tr.executor,
        num_workers=tr.num_workers,
    )
    agg = tr.aggregator
    aggregator = make_aggregator(
        agg.name, trim=agg.trim, krum_f=agg.krum_f, multi_krum_m=agg.multi_krum_m
    )
    return Setup(
        config=cfg,
        dataset=dataset,
        model=model,
        initial_params=get_flat_params(model),
        federation=federation,
        aggregator=aggregator,
        x_test=torch.from_numpy(np.ascontiguousarray(x_test)),
        y_test=torch.from_numpy(y_test),
        trigger=trigger,
        poisoned_originals=originals,
    )


def reference_set(setup: Setup) -> ClientData:
    """Return Crab's clean reference set R: a seeded subsample of the clients' clean data.

    R has ``history.crab.reference_size`` samples drawn without replacement (seed derived from
    the run's seed) from the union of every client's training data *before* poisoning (Crab spec
    §2.2 [rec]); it stands in for the clients computing F and p(M) on their own data. The
    recording policy and the ``crab`` method both call this, so they use the same R.
    """
    parts = [setup.clean_data(c) for c in sorted(setup.federation.client_ids)]
    total = sum(len(p) for p in parts)
    size = setup.config.history.crab.reference_size
    if size < total:
        rng = np.random.default_rng(derive_seed(setup.config.seed, "crab_reference"))
        chosen = np.sort(rng.choice(total, size=size, replace=False))
    else:
        chosen = np.arange(total)
    # gather per client (no copy of the whole union: CIFAR-10 would be 0.7 GB)
    xs, ys, offset = [], [], 0
    for part in parts:
        local = chosen[(chosen >= offset) & (chosen < offset + len(part))] - offset
        idx = torch.from_numpy(local)
        xs.append(part.x[idx])
        ys.append(part.y[idx])
        offset += len(part)
    return ClientData(torch.cat(xs), torch.cat(ys))


def reference_scorer(setup: Setup) -> ReferenceScorer:
    """Return the scorer (F and round divergence on R) of the run's Crab options."""
    ref = reference_set(setup)
    return ReferenceScorer(setup.model, ref.x, ref.y, setup.config.history.crab.divergence)


def make_recording_policy(
    config: RunConfig, setup: Setup, privacy: PrivateTraining | None = None
) -> RecordingPolicy | DeferredPolicy:
    """Return the run's recording policy (``crab`` needs the model and reference set).

    ``fedadp`` with ``privacy.dp_scope: store_only`` stores the seeded noisy copies made by
    ``privacy``'s mod.
    """
    if config.history.policy == "fedadp":
        opts = config.history.fedadp
        store_only = privacy is not None and privacy.mod is not None and not privacy.mod.perturb
        return FedADPPolicy(
            beta=opts.beta,
            round_ratio=opts.round_ratio,
            client_ratio=opts.client_ratio,
            final_round=config.training.rounds,
            model_align=opts.model_align,
            selection_mode=opts.selection_mode,
            store_transform=(lambda r, c, d: privacy.mod.privatize(r, c, d)[0])
            if store_only and privacy is not None
            else None,
        )
    if config.history.policy != "crab":
        return make_policy(config.history.policy, config.history.every)
    opts = config.history.crab
    return CrabPolicy(
        reference_scorer(setup),
        alpha=opts.alpha,
        round_ratio=opts.round_ratio,
        client_ratio=opts.client_ratio,
        final_round=config.training.rounds,
        rounding=opts.rounding,
        max_window=opts.max_window,
    )


def clients_loss(setup: Setup, params: torch.Tensor) -> float:
    """Return FedADP's server loss: the n_c-weighted mean of each client's loss on its own data.

    Each client evaluates ``params`` on its first ``history.fedadp.loss_samples`` samples
    (FedADP spec A3); the loss is non-private metadata (not accounted).
    """
    cap = setup.config.history.fedadp.loss_samples
    fed = setup.federation
    parts = [fed.client_data[c] for c in fed.client_ids]
    x = torch.cat([p.x[:cap] for p in parts])
    y = torch.cat([p.y[:cap] for p in parts])
    losses = F.cross_entropy(predict_logits(setup.model, params, x), y, reduction="none")
    total, offset, weight = 0.0, 0, 0
    for p in parts:
        m = min(cap, len(p))
        if m:
            total += len(p) * float(losses[offset : offset + m].to(torch.float64).mean())
            weight += len(p)
        offset += m
    return total / max(weight, 1)


def attach_privacy(config: RunConfig, setup: Setup) -> PrivateTraining | None:
    """Resolve S (pilot if ``auto``) and attach the DP mod to the federation, for training.

    Unlearning sessions build the federation without it (fresh updates are not noised unless
    a method asks), so call this only to train.
    """
    cfg = config.privacy
    if not cfg.enabled:
        return None
    # -- privacy.mechanism (dp_sgd: C from per-example gradients; attach sets local_training)
    if cfg.clip_norm != "auto":
        clip_norm = float(cfg.clip_norm)
    elif cfg.mechanism == "dp_sgd":
        fed = setup.federation
        clip_norm, _ = gradient_clip_norm(fed.model, setup.initial_params, fed.client_data)
    else:
        clip_norm, _ = pilot_clip_norm(
            setup.federation, setup.aggregator, setup.initial_params, rounds=cfg.pilot_rounds
        )
    privacy = PrivateTraining(cfg, seed=config.seed, clip_norm=clip_norm)
    privacy.attach(setup.federation)
    # -- end privacy.mechanism
    return privacy


def training_evaluator(
    config: RunConfig, setup: Setup, privacy: PrivateTraining | None
) -> Callable[[torch.Tensor], dict[str, Any]]:
    """Return the round evaluation of training: test metrics, server loss, the DP ledger."""
    server_loss = privacy is not None or config.history.policy == "fedadp"

    def evaluate(params: torch.Tensor) -> dict[str, Any]:
        out: dict[str, Any] = dict(setup.evaluate(params))
        if server_loss:
            out[LOSS_KEY] = clients_loss(setup, params)
        if privacy is not None:
            out.update(privacy.latest_scalars())
        return out

    return evaluate


def run_privacy(config: RunConfig, store: HistoryStore) -> dict[str, Any]:
    """Return the run's privacy ledger summary from its stored round scalars."""
    last = store.last_round() or 0
    scalars = [store.round_scalars(r) for r in range(1, last + 1)]
    return privacy_summary(config.privacy, scalars, store.meta.get("num_params"))


class MetricsWriter:
    """Round observer appending one JSON line of metrics per round."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_round_end(self, record: RoundRecord) -> None:
        """Append the round's metrics."""
        with self.path.open("a") as fh:
            fh.write(json.dumps(metrics_line(record.round, record.metrics, record)) + "\n")


def metrics_line(round_: int, metrics: dict[str, Any], record: RoundRecord | None = None) -> dict:
    """Return the JSON-lines row of a round."""
    row: dict[str, Any] = {"round": round_, **metrics}
    if record is not None:
        row["num_accepted"] = len(record.updates)
        row["num_rejected"] = len(record.rejected)
    return row


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


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
            _write_json(run_dir / PRIVACY_FILE, ledger)
            summary["privacy"] = {
                k: ledger[k] for k in ("dp_scope", "clip_norm", "total_epsilon", "delta")
            }
        _write_json(run_dir / SUMMARY_FILE, summary)
        return summary
    finally:
        setup.close()
        if store is not None:
            store.close()


def load_run_config(run_dir: str | Path) -> RunConfig:
    """Return the config a run directory was trained with."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.exists():
        raise HistoryError(f"{run_dir} is not a run directory (no {CONFIG_FILE})")
    return load_config(path)


def run_info(run_dir: str | Path) -> dict[str, Any]:
    """Describe a run: config, rounds, stored bytes (total, per kind, per client), metrics."""
    run_dir = Path(run_dir)
    config = load_run_config(run_dir)
    with HistoryStore.open(run_dir / HISTORY_DIR) as store:
        rounds = store.rounds()
        last = rounds[-1] if rounds else None
        info: dict[str, Any] = {
            "run_dir": str(run_dir),
            "dataset": config.data.dataset,
            "model": config.model.name,
            "num_params": store.meta.get("num_params"),
            "num_clients": config.data.num_clients,
            "rounds_planned": config.training.rounds,
            "rounds_completed": last or 0,
            "complete": last == config.training.rounds,
            "history_policy": config.history.policy,
            "attack": config.attack.kind,
            "malicious_clients": store.meta.get("malicious", []),
            "stored_bytes": store.stored_bytes(),
            "stored_bytes_by_kind": store.stored_bytes_by_kind(),
            "stored_bytes_by_client": {
                str(k): v for k, v in sorted(store.stored_bytes_by_client().items())
            },
            "file_bytes": store.file_bytes(),
            "metrics": [metrics_line(r, store.round_scalars(r)) for r in rounds],
            "privacy": run_privacy(config, store),
        }
    return info
