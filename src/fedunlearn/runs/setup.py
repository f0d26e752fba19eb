"""What a run's config determines before any training: data, poisoning, model, federation.

``build_setup(config)`` loads and partitions the data, poisons the malicious clients, builds the
model, the federation and the aggregator, always the same way for the same config (every random
choice derives from (seed, purpose, round, client)). ``reference_set`` and ``clients_loss`` are
the two server-side views of the clients' data a recording policy or a privacy schedule may ask
for: a seeded clean subsample, and the clients' mean loss on their own data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from fedunlearn.config import RunConfig
from fedunlearn.data import Dataset, load_dataset, partition
from fedunlearn.errors import ConfigError
from fedunlearn.fl.aggregators import Aggregator, make_aggregator
from fedunlearn.fl.attacks import (
    Trigger,
    UpdateAttack,
    backdoor_data,
    choose_malicious,
    label_flip_data,
)
from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.federation import Federation, UpdateMod
from fedunlearn.fl.markers import Marker, embed_markers
from fedunlearn.fl.metrics import accuracy_and_loss, backdoor_success_rate, predict_logits
from fedunlearn.fl.records import ClientData
from fedunlearn.fl.seeding import derive_seed, torch_generator
from fedunlearn.models import build_model, get_flat_params

__all__ = ["DEFAULT_LOSS_SAMPLES", "Setup", "build_setup", "clients_loss", "reference_set"]

# Seed purpose of the reference set. Named after its first user (Crab's R); renaming it would
# change every result that uses a reference set.
_REFERENCE_PURPOSE = "crab_reference"
DEFAULT_LOSS_SAMPLES = 512


@dataclass
class Setup:
    """Everything a run's config determines, before any training.

    ``join_rounds``: client -> the round it joins the federation (attackers with
    ``attack.join_round``; the training loop does not sample them before it).
    ``markers``: client -> its participation marker (``verification.markers``); in a real
    deployment it stays with the client, here the receipt reads it to probe for it.
    ``unmarked``: client -> its clean data without the marked copies.
    """

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
    join_rounds: dict[int, int] = field(default_factory=dict)
    markers: dict[int, Marker] = field(default_factory=dict)
    unmarked: dict[int, ClientData] = field(default_factory=dict)

    def clean_data(self, client_id: int) -> ClientData:
        """Return a client's data before poisoning (its true labels, no trigger, no marker)."""
        if client_id in self.unmarked:
            return self.unmarked[client_id]
        return self.poisoned_originals.get(client_id, self.federation.client_data[client_id])

    def evaluate(self, params: torch.Tensor) -> dict[str, float]:
        """Return test accuracy, test loss and (with a backdoor attack) the backdoor ASR."""
        device = self.federation.device
        acc, loss = accuracy_and_loss(self.model, params, self.x_test, self.y_test, device)
        out = {"test_accuracy": acc, "test_loss": loss}
        if self.trigger is not None:
            out["backdoor_asr"] = backdoor_success_rate(
                self.model,
                params,
                self.x_test,
                self.y_test,
                self.trigger,
                self.config.attack.target_label,
                device,
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
    markers, unmarked = embed_markers(  # opt-in (verification.markers): fl/markers.py
        cfg.verification.markers,
        cfg.seed,
        dataset,
        client_data,
        originals,
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
                start_round=atk.start_round,
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
        honest_data=originals,  # attackers train on these before attack.start_round
        attack_start_round=atk.start_round,
        executor=tr.executor,
        num_workers=tr.num_workers,
        device=tr.device,
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
        join_rounds={c: atk.join_round for c in malicious} if atk.join_round > 1 else {},
        markers=markers,
        unmarked=unmarked,
    )


def reference_set(setup: Setup, size: int) -> ClientData:
    """Return a seeded clean subsample R of the clients' training data, of ``size`` samples.

    R is drawn without replacement (seed derived from the run's seed) from the union of every
    client's training data *before* poisoning; it stands in for the clients computing losses
    and predictions on their own data (Crab's F and p(M), paper Alg. 1). The same size and seed
    give the same R, so a recording policy and an unlearning method asking for it agree.
    """
    parts = [setup.clean_data(c) for c in sorted(setup.federation.client_ids)]
    total = sum(len(p) for p in parts)
    if size < total:
        rng = np.random.default_rng(derive_seed(setup.config.seed, _REFERENCE_PURPOSE))
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


def clients_loss(setup: Setup, params: torch.Tensor, samples: int = DEFAULT_LOSS_SAMPLES) -> float:
    """Return the n_c-weighted mean of each client's loss on its first ``samples`` samples.

    The server-side loss that FedADP's budget schedule (Eq. 4) and stage selection read; it is
    non-private metadata (not accounted).
    """
    fed = setup.federation
    parts = [fed.client_data[c] for c in fed.client_ids]
    x = torch.cat([p.x[:samples] for p in parts])
    y = torch.cat([p.y[:samples] for p in parts])
    logits = predict_logits(setup.model, params, x, device=fed.device)
    losses = F.cross_entropy(logits, y, reduction="none")
    total, offset, weight = 0.0, 0, 0
    for p in parts:
        m = min(samples, len(p))
        if m:
            total += len(p) * float(losses[offset : offset + m].to(torch.float64).mean())
            weight += len(p)
        offset += m
    return total / max(weight, 1)
