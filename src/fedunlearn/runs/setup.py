"""What a run's config determines before any training: data, poisoning, model, federation.

``build_setup(config)`` loads and partitions the data (or takes the clients' data from a user
data source, ``fedunlearn.runs.user``), poisons the malicious clients, builds the
model, the federation and the aggregator, always the same way for the same config (every random
choice derives from (seed, purpose, round, client)). ``reference_set`` and ``clients_loss`` are
the two server-side views of the clients' data a recording policy or a privacy schedule may ask
for: a seeded clean subsample, and the clients' mean loss on their own data.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from fedunlearn.config import (
    BackdoorAttack,
    FangTrimAttack,
    LabelFlipAttack,
    RunConfig,
    TrimRandomAttack,
    backdoor_target,
)
from fedunlearn.data import Dataset, FederatedData
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
from fedunlearn.fl.device import resolve_device
from fedunlearn.fl.engine import Sharding
from fedunlearn.fl.federation import Federation, UpdateMod
from fedunlearn.fl.markers import Marker, embed_markers
from fedunlearn.fl.metrics import accuracy_and_loss, backdoor_success_rate, predict_logits
from fedunlearn.fl.records import ClientData
from fedunlearn.fl.sampling import (
    ClientSampler,
    FractionSampler,
    TvStableSampler,
    tv_clients_per_round,
)
from fedunlearn.fl.seeding import derive_seed, torch_generator
from fedunlearn.fl.shards import ShardPlan
from fedunlearn.models import build_model, federated_buffers, get_flat_params
from fedunlearn.models.registry import ModelFactory
from fedunlearn.runs.setup_data import LoadedData, load_data
from fedunlearn.runs.user import FunctionTrigger, user_model

__all__ = [
    "DEFAULT_LOSS_SAMPLES",
    "Setup",
    "aggregator_of",
    "build_setup",
    "clients_loss",
    "reference_set",
    "sampler_of",
    "shard_plan",
    "shard_samplers",
    "training_spec",
    "with_recorded_executor",
]

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
    dataset: Dataset | FederatedData
    model: nn.Module
    initial_params: torch.Tensor
    federation: Federation
    aggregator: Aggregator
    x_test: torch.Tensor
    y_test: torch.Tensor
    trigger: Trigger | FunctionTrigger | None
    poisoned_originals: dict[int, ClientData]
    join_rounds: dict[int, int] = field(default_factory=dict)
    components: dict[str, dict[str, Any]] = field(default_factory=dict)
    markers: dict[int, Marker] = field(default_factory=dict)
    unmarked: dict[int, ClientData] = field(default_factory=dict)

    @property
    def held_out(self) -> Mapping[int, tuple[torch.Tensor, torch.Tensor]]:
        """Client id -> its held-out set, where the user's data gives them (else empty)."""
        if isinstance(self.dataset, FederatedData) and self.dataset.held_out is not None:
            return self.dataset.held_out
        return {}

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
                backdoor_target(self.config.attack),
                device,
            )
        return out

    def ensemble_metrics(self, shard_params: Mapping[int, torch.Tensor]) -> dict[str, float]:
        """Return the test accuracy of the shards' prediction ensemble (mean softmax)."""
        device = self.federation.device
        probs = None
        for shard in sorted(shard_params):
            logits = predict_logits(self.model, shard_params[shard], self.x_test, device=device)
            p = torch.softmax(logits.to(torch.float64), dim=1)
            probs = p if probs is None else probs + p
        assert probs is not None
        correct = (probs.argmax(dim=1) == self.y_test.to(probs.device)).to(torch.float64)
        return {"ensemble_test_accuracy": float(correct.mean())}

    def sharding(self) -> Sharding | None:
        """Return how a sharded run trains (None for an unsharded run)."""
        plan = shard_plan(self.config)
        if plan is None:
            return None
        return Sharding(plan, shard_samplers(self.config, plan), self.ensemble_metrics)

    def close(self) -> None:
        """Stop the federation's worker processes."""
        self.federation.close()


def with_recorded_executor(config: RunConfig, recorded: object, device: object = None) -> RunConfig:
    """The config a run's later steps build with: ``auto`` pinned to what the run trained with.

    ``auto`` picks by model structure and, for conv nets on the CPU, by the CPUs available
    (``pool`` with more than one, else ``serial``), and the two round differently. Resume,
    ``train --continue`` and unlearning sessions (so a receipt and an auditor's replay on a
    machine with another CPU count) must train the way the run did: the store records the
    resolved kind (metadata ``executor``), and this pins it. Likewise ``training.device: auto``
    is pinned to the device the run trained on (metadata ``device``) where this machine has it,
    so a replay on a machine with a GPU of a run trained on the CPU runs on the CPU (bit for
    bit); where it does not, ``auto`` stays, and results may differ in the last bits (a replay
    then fails and says so). Runs recorded before either key keep ``auto``.
    """
    training = config.training
    updates: dict[str, str] = {}
    if training.executor == "auto" and recorded in ("serial", "vectorized", "pool"):
        updates["executor"] = str(recorded)
    if training.device == "auto" and isinstance(device, str) and _available(device):
        updates["device"] = device
    if not updates:
        return config
    return config.model_copy(update={"training": training.model_copy(update=updates)})


def _available(device: str) -> bool:
    """Whether this machine has ``device`` (a recorded, resolved name such as ``cuda:0``)."""
    try:
        resolve_device(device)
    except ConfigError:
        return False
    return True


def _poison(
    cfg: RunConfig, loaded: LoadedData
) -> tuple[
    frozenset[int], Trigger | FunctionTrigger | None, dict[int, ClientData], list[UpdateMod]
]:
    """Poison the malicious clients' data in place; ``(malicious, trigger, originals, mods)``.

    ``originals``: the poisoned clients' data before poisoning; ``mods``: the update attacks.
    """
    client_data = loaded.client_data
    malicious = choose_malicious(
        cfg.data.num_clients, cfg.attack.num_malicious, derive_seed(cfg.seed, "attack", 0)
    )
    trigger: Trigger | FunctionTrigger | None = None
    atk = cfg.attack
    originals: dict[int, ClientData] = {}
    for cid in sorted(malicious):
        if isinstance(atk, BackdoorAttack | LabelFlipAttack):
            originals[cid] = client_data[cid]
        gen = torch_generator(derive_seed(cfg.seed, "attack", 1, cid))
        if isinstance(atk, BackdoorAttack):
            trigger = Trigger(atk.trigger_size) if loaded.trigger is None else loaded.trigger
            client_data[cid] = backdoor_data(
                client_data[cid], trigger, atk.target_label, atk.poison_fraction, gen
            )
        elif isinstance(atk, LabelFlipAttack):
            client_data[cid] = label_flip_data(
                client_data[cid], loaded.num_classes, atk.poison_fraction, gen
            )
    mods: list[UpdateMod] = []
    if isinstance(atk, TrimRandomAttack | FangTrimAttack):
        knobs = atk.options("kind", "num_malicious", "join_round")
        mods.append(UpdateAttack(atk.kind, malicious, derive_seed(cfg.seed, "attack", 2), **knobs))
    return malicious, trigger, originals, mods


def _network(
    cfg: RunConfig,
    model: ModelFactory | None,
    loaded: LoadedData,
    components: dict[str, dict[str, Any]],
) -> nn.Module:
    """Build the model: a user factory (recorded in ``components``) or a registered one."""
    if model is not None or cfg.model.factory is not None:
        net, components["model"] = user_model(
            cfg, model, loaded.input_shape, loaded.num_classes, loaded.x_test
        )
    else:
        options: dict[str, Any] = {}
        if cfg.model.name == "mlp":
            options["hidden"] = tuple(cfg.model.hidden)
        if cfg.model.name == "textcnn":
            meta = loaded.dataset.meta if isinstance(loaded.dataset, Dataset) else {}
            options["vocab_size"] = int(meta.get("vocab_size", 25002))
        net = build_model(
            cfg.model.name,
            loaded.input_shape,
            loaded.num_classes,
            seed=derive_seed(cfg.seed, "model"),
            **options,
        )
    if cfg.privacy.enabled and federated_buffers(net):
        raise ConfigError(
            f"privacy.enabled cannot cover {type(net).__name__}: its buffers ("
            f"{', '.join(n for n, _ in federated_buffers(net)[:3])}, ...) are statistics of the "
            "clients' data that DP noise does not protect; use a model without BatchNorm "
            "(e.g. GroupNorm) for DP training"
        )
    return net


def _check_local_steps(spec: LocalTrainingSpec, client_data: Mapping[int, ClientData]) -> None:
    """Refuse ``training.local_steps`` when a client holds fewer samples than one batch."""
    if spec.steps is None:
        return
    small = {c: len(d) for c, d in client_data.items() if len(d) < spec.batch_size}
    if small:
        c = min(small, key=lambda k: (small[k], k))
        raise ConfigError(
            f"training.local_steps draws mini-batches of training.batch_size "
            f"({spec.batch_size}) samples without replacement; {len(small)} client(s) hold "
            f"fewer (client {c}: {small[c]}). Lower training.batch_size or set "
            f"data.min_client_samples: {spec.batch_size}"
        )


def build_setup(
    config: RunConfig,
    *,
    model: ModelFactory | None = None,
    data: FederatedData | Mapping[str, Any] | None = None,
) -> Setup:
    """Load data, partition it, poison the malicious clients and build the federation.

    Args:
        config: The run's config.
        model: A model factory ``(input_shape, num_classes, **options) -> nn.Module`` to use
            instead of the config's ``model.factory`` / ``model.name``.
        data: The federation's data (``FederatedData`` or the plain mapping) to use instead of
            the config's ``data.source`` / ``data.dataset``.

    Raises:
        ConfigError: A user component cannot be resolved, raises, or returns what does not fit
            (one line naming it; fedunlearn.runs.user), before any training.
    """
    cfg = config
    components: dict[str, dict[str, Any]] = {}
    loaded = load_data(cfg, data, components)
    client_data = loaded.client_data
    malicious, trigger, originals, mods = _poison(cfg, loaded)
    markers, unmarked = embed_markers(  # opt-in (verification.markers): fl/markers.py
        cfg.verification.markers,
        cfg.seed,
        loaded.dataset,
        client_data,
        originals,
    )
    net = _network(cfg, model, loaded, components)
    tr, atk = cfg.training, cfg.attack
    spec = training_spec(cfg)
    _check_local_steps(spec, client_data)
    federation = Federation(
        net,
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
    return Setup(
        config=cfg,
        dataset=loaded.dataset,
        model=net,
        initial_params=get_flat_params(net),
        federation=federation,
        aggregator=aggregator_of(cfg),
        x_test=loaded.x_test,
        y_test=loaded.y_test,
        trigger=trigger,
        poisoned_originals=originals,
        join_rounds={c: atk.join_round for c in malicious} if atk.join_round > 1 else {},
        components=components,
        markers=markers,
        unmarked=unmarked,
    )


def training_spec(config: RunConfig) -> LocalTrainingSpec:
    """Return the run's local training hyperparameters (E, η, B, momentum, weight decay).

    With ``training.local_steps`` (needed by TV-stable sampling) local work is that many
    mini-batch steps.
    """
    tr = config.training
    return LocalTrainingSpec(
        epochs=tr.local_epochs,
        lr=tr.lr,
        batch_size=tr.batch_size,
        momentum=tr.momentum,
        weight_decay=tr.weight_decay,
        steps=tr.local_steps,
    )


def shard_plan(config: RunConfig) -> ShardPlan | None:
    """Return a sharded run's assignment (``training.shard_map`` or seeded balanced), else None."""
    tr = config.training
    if tr.shards <= 1:
        return None
    if tr.shard_map is not None:
        return ShardPlan(tr.shards, tr.shard_map)
    return ShardPlan.balanced(range(config.data.num_clients), tr.shards, config.seed)


def shard_samplers(config: RunConfig, plan: ShardPlan) -> dict[int, ClientSampler]:
    """Return each shard's sampler (keyed by the shard: independent draws per shard)."""
    return {s: sampler_of(config, len(plan.members(s)), key=(s,)) for s in plan.shards}


def sampler_of(
    config: RunConfig, num_clients: int | None = None, key: tuple[int, ...] = ()
) -> ClientSampler:
    """Return the run's client sampler (``fl.sampling``).

    Args:
        config: The run config.
        num_clients: Clients the sampler draws among (a shard's size); default the run's.
            TV-stable sampling's K is ``participation`` x this, frozen with the config.
        key: Extra seed keys (a shard's index).
    """
    tr = config.training
    if tr.sampling == "tv_stable":
        m = config.data.num_clients if num_clients is None else num_clients
        return TvStableSampler(tv_clients_per_round(tr.participation, m), config.seed, key)
    return FractionSampler(tr.participation, config.seed, key)


def aggregator_of(config: RunConfig) -> Aggregator:
    """Return the run's aggregation rule."""
    agg = config.training.aggregator
    return make_aggregator(agg.name, **agg.options("name"))


def reference_set(setup: Setup, size: int, clients: Collection[int] | None = None) -> ClientData:
    """Return a seeded clean subsample R of the clients' training data, of ``size`` samples.

    R is drawn without replacement (seed derived from the run's seed) from the union of every
    client's training data *before* poisoning; it stands in for the clients computing losses
    and predictions on their own data (Crab's F and p(M), paper Alg. 1). The same size and seed
    give the same R, so a recording policy and an unlearning method asking for it agree.
    ``clients`` restricts it to those clients (a continuation: never a forgotten client's data).
    """
    ids = setup.federation.client_ids if clients is None else clients
    parts = [setup.clean_data(c) for c in sorted(ids)]
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


def clients_loss(
    setup: Setup,
    params: torch.Tensor,
    samples: int = DEFAULT_LOSS_SAMPLES,
    clients: Collection[int] | None = None,
) -> float:
    """Return the n_c-weighted mean of each client's loss on its first ``samples`` samples.

    The server-side loss that FedADP's budget schedule (Eq. 4) and stage selection read; it is
    non-private metadata (not accounted). ``clients`` restricts it to those clients (a
    continuation: never a forgotten client's data).
    """
    fed = setup.federation
    ids = fed.client_ids if clients is None else [c for c in fed.client_ids if c in clients]
    parts = [fed.client_data[c] for c in ids]
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
