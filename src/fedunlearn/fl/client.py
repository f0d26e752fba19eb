"""Client-side work as a pure function: local mini-batch SGD from the global model.

``local_update(model, global_params, data, spec, seed)`` depends only on its arguments, so the same
code runs in-process, in a worker pool, vectorised (checked against this loop) or under Flower.
Batching: each epoch draws ``torch.randperm(n, generator)`` from a generator seeded with ``seed``
and walks it in chunks of ``batch_size`` (the last chunk may be smaller); the loss is the mean
cross-entropy of the chunk; the optimiser is ``torch.optim.SGD(lr, momentum, weight_decay)``.
With ``spec.steps`` set (TV-stable training, FATS Alg. 1 lines 11-14), local training is instead
``steps`` iterations, each on a fresh mini-batch of exactly ``batch_size`` samples drawn without
replacement by ``fl.sampling.step_batches`` (deletion-consistent: keyed by the samples' stable
ids), with a fresh optimiser each round.
Training runs where the client's data lives (``data.x.device``: executors place it once); the
batch order is drawn on the CPU whatever the device, and the delta comes back on the CPU.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from fedunlearn.errors import ConfigError
from fedunlearn.fl.device import cuda_determinism, sum_dtype
from fedunlearn.fl.records import ClientData, ClientUpdate
from fedunlearn.fl.sampling import step_batches
from fedunlearn.fl.seeding import torch_generator
from fedunlearn.models.flat import get_flat_params, set_flat_params


@dataclass(frozen=True)
class LocalTrainingSpec:
    """Hyperparameters of one client's local training (E, η, B, momentum, L2 weight decay).

    ``steps``: when set, local training is that many mini-batch steps of exactly
    ``batch_size`` samples each (TV-stable training) instead of ``epochs`` passes.
    """

    epochs: int = 1
    lr: float = 0.05
    batch_size: int = 64
    momentum: float = 0.0
    weight_decay: float = 0.0
    steps: int | None = None

    def __post_init__(self) -> None:
        if self.epochs < 0:
            raise ConfigError(f"local epochs must be >= 0; got {self.epochs}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1; got {self.batch_size}")
        if not self.lr > 0:
            raise ConfigError(f"lr must be > 0; got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"momentum must be in [0, 1); got {self.momentum}")
        if self.weight_decay < 0:
            raise ConfigError(f"weight_decay must be >= 0; got {self.weight_decay}")
        if self.steps is not None and self.steps < 1:
            raise ConfigError(f"local steps must be >= 1; got {self.steps}")


def batch_plan(
    data: ClientData,
    spec: LocalTrainingSpec,
    generator: torch.Generator,
    seed: int,
    device: torch.device | None = None,
) -> list[torch.Tensor]:
    """Return every mini-batch of one client's local training, as row indices, in order.

    Epoch mode: ``epochs`` seeded permutations cut into ``batch_size`` chunks
    (``epoch_batches``). Step mode (``spec.steps``): ``fl.sampling.step_batches``.
    """
    if spec.steps is None:
        return [
            b
            for _ in range(spec.epochs)
            for b in epoch_batches(len(data), spec.batch_size, generator, device)
        ]
    ids = data.sample_ids().cpu().numpy()
    plan = [torch.from_numpy(p) for p in step_batches(seed, ids, spec.batch_size, spec.steps)]
    if device is not None and device.type != "cpu":
        plan = [p.to(device) for p in plan]
    return plan


def epoch_batches(
    n: int, batch_size: int, generator: torch.Generator, device: torch.device | None = None
) -> list[torch.Tensor]:
    """Return one epoch's batches: a seeded permutation cut into ``batch_size`` chunks.

    The permutation is drawn on the CPU (the same on every device) and, for another ``device``,
    copied there once per epoch.
    """
    perm = torch.randperm(n, generator=generator)
    if device is not None and device.type != "cpu":
        perm = perm.to(device)
    return list(perm.split(batch_size))


def local_update(
    model: nn.Module,
    global_params: torch.Tensor,
    data: ClientData,
    spec: LocalTrainingSpec,
    seed: int,
    client_id: int = -1,
) -> ClientUpdate:
    """Train a copy of ``model`` from ``global_params`` on ``data`` and return its delta.

    Args:
        model: Template module; it is not modified.
        global_params: Flat float32 parameters M_t.
        data: The client's training set; training runs on its device.
        spec: Local training hyperparameters.
        seed: Seed of the batch order (and of dropout, if the model has any).
        client_id: Id recorded in the returned update.

    Returns:
        ``ClientUpdate`` with ``delta = M_local - M_t`` (on the CPU) and the sample-weighted mean
        training loss.
    """
    device = data.x.device
    start = global_params.to(device)
    local = copy.deepcopy(model).to(device)
    set_flat_params(local, start)
    local.train()
    opt = torch.optim.SGD(
        local.parameters(), lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay
    )
    generator = torch_generator(seed)
    n = len(data)
    # summed on the device (no host sync per step); the same float64 operations as a Python sum
    loss_sum = torch.zeros((), dtype=sum_dtype(device), device=device)
    seen = 0
    rng_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=rng_devices), cuda_determinism(device):
        torch.manual_seed(seed)  # dropout and other in-model randomness
        for idx in batch_plan(data, spec, generator, seed, device):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(local(data.x[idx]), data.y[idx])
            loss.backward()
            opt.step()
            loss_sum += loss.detach().to(loss_sum.dtype) * len(idx)
            seen += len(idx)
    delta = (get_flat_params(local) - start).cpu()
    return ClientUpdate(
        client_id=client_id,
        delta=delta,
        num_samples=n,
        train_loss=float(loss_sum) / seen if seen else float("nan"),
    )
