"""DP-SGD local training of one client: Poisson batches, per-example clipping, Gaussian noise.

``dp_sgd_update`` is the reference (any model with per-example gradients, one client at a time);
``fedunlearn.privacy.dp_sgd_vectorized`` trains many clients at once and is tested against it.
Both share the pieces here, so a client's batches and noise are the same draws in either:

1. Sampling (Poisson, rate q = min(1, B / n_c)): ``steps = ceil(E / q)`` steps, i.e.
   ``ceil(E n_c / B)`` (E epochs in expectation); at each step every example joins the batch
   independently with probability q, from ``torch.rand(n_c, generator)`` < q, the generator
   seeded by ``derive_seed(task_seed, "dp_sgd_batches")`` (with a release's salt appended, as
   the noise's). Batches vary in size, may be empty.
2. Per-example gradients of the cross-entropy, each clipped to L2 norm C
   (:mod:`fedunlearn.privacy.per_example`), summed.
3. Noise: σ C ξ with ξ ~ N(0, I_d) drawn by ``normal_`` into a d-vector from a generator seeded
   by ``derive_seed(task_seed, "dp_sgd_noise")``, added to the sum; the result is divided by the
   expected batch size q n_c (Opacus's convention for Poisson sampling), giving the step's
   gradient. An empty batch still gets its noise.
4. Step: ``torch.optim.SGD`` arithmetic (weight decay added to the noisy gradient, momentum
   buffer, ``p -= lr * step``), as Opacus's ``DPOptimizer`` leaves it to the wrapped optimiser.

The task seed is ``derive_seed(run seed, "client", round, client, salt)`` (``fl/federation.py``),
so a round is bit-identical on a rerun or a resume. Each client also tracks the noise's direct
contribution to its delta (the same momentum and ``-lr`` applied to the noise terms alone), so
the ledger can report the noise-to-signal ratio of the aggregate.

The guarantee is per example (add/remove one training example of one client, sensitivity C),
not per client: a client's whole dataset is protected only by group privacy.

Paper: Abadi et al., "Deep Learning with Differential Privacy", CCS 2016, Alg. 1; sampling and
accounting as Mironov, Talwar, Zhang, "Rényi DP of the Sampled Gaussian Mechanism", 2019. The
FedADP paper (Jiang et al.) budgets ε_t per round (Eq. 4); here that budget is spent by DP-SGD
inside the round (docs/privacy.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.records import ClientData, ClientUpdate, check_task_clients
from fedunlearn.fl.seeding import derive_seed, torch_generator
from fedunlearn.privacy.per_example import check_per_example_model, per_example_clipped_sum

__all__ = [
    "ClientNoise",
    "ParamLayout",
    "dp_sgd_update",
    "num_steps",
    "poisson_batches",
    "sample_rate",
    "steps_of",
]


def sample_rate(num_samples: int, batch_size: int) -> float:
    """Return q = min(1, B / n): the Poisson rate giving expected batch size B."""
    if num_samples < 1:
        raise ConfigError(f"a client with {num_samples} samples has no sample rate")
    return min(1.0, batch_size / num_samples)


def num_steps(num_samples: int, spec: LocalTrainingSpec) -> int:
    """Return ceil(E / q) = ceil(E n / B) steps (E when q = 1); 0 for a client without data."""
    return steps_of(num_samples, spec.epochs, spec.batch_size)


def steps_of(num_samples: int, epochs: int, batch_size: int) -> int:
    """``num_steps`` from E and B alone."""
    if num_samples < 1:
        return 0
    if num_samples <= batch_size:
        return epochs
    return -(-epochs * num_samples // batch_size)


def batch_generator(task_seed: int, salt: int = 0) -> torch.Generator:
    """Return the generator of a task's Poisson draws.

    ``salt`` != 0 gives another release its own batches, as ``noise_generator`` its own noise:
    the sampled-Gaussian accounting of two releases composes them as independent, which
    releases that share their Poisson draws are not (docs/privacy.md, "Shared randomness").
    """
    if salt:
        return torch_generator(derive_seed(task_seed, "dp_sgd_batches", salt))
    return torch_generator(derive_seed(task_seed, "dp_sgd_batches"))


def noise_generator(task_seed: int, salt: int = 0) -> torch.Generator:
    """Return the generator of a task's Gaussian noise draws.

    ``salt`` != 0 gives another release its own noise: a DP release re-running a round (DP
    Retrain, a continuation after an applied trajectory) must not reuse the noise of the
    round's earlier release, or the difference of the two cancels it.
    """
    if salt:
        return torch_generator(derive_seed(task_seed, "dp_sgd_noise", salt))
    return torch_generator(derive_seed(task_seed, "dp_sgd_noise"))


def poisson_batches(
    num_samples: int, spec: LocalTrainingSpec, generator: torch.Generator
) -> list[torch.Tensor]:
    """Return every step's sampled row indices (int64, sorted), ``num_steps`` of them."""
    steps = num_steps(num_samples, spec)
    if steps == 0:
        return []
    q = sample_rate(num_samples, spec.batch_size)
    return [
        torch.nonzero(torch.rand(num_samples, generator=generator) < q).flatten()
        for _ in range(steps)
    ]


class ParamLayout:
    """A model's parameters as one flat vector per client (``model.parameters()`` order)."""

    def __init__(self, model: nn.Module) -> None:
        self.names = [name for name, _ in model.named_parameters()]
        self.shapes = [tuple(p.shape) for _, p in model.named_parameters()]
        self.sizes = [math.prod(s) for s in self.shapes]
        self.num_params = sum(self.sizes)

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Split ``flat`` (..., d) into named views shaped (..., *param shape)."""
        lead = flat.shape[:-1]
        pieces = flat.split(self.sizes, dim=-1)
        return {
            name: piece.view(*lead, *shape)
            for name, piece, shape in zip(self.names, pieces, self.shapes, strict=True)
        }

    def flatten(self, tensors: Mapping[str, torch.Tensor], lead: int) -> torch.Tensor:
        """Concatenate named tensors shaped (lead..., *param shape) into (lead..., d)."""
        if lead == 0:
            return torch.cat([tensors[name].reshape(-1) for name in self.names])
        batch = tensors[self.names[0]].shape[:lead]
        return torch.cat([tensors[name].reshape(*batch, -1) for name in self.names], dim=-1)


@dataclass(frozen=True)
class ClientNoise:
    """What DP-SGD did to one client's update, for the round's ledger.

    Attributes:
        noise_delta: The noise terms' direct contribution to the delta (d,), float32.
        norms: Every sampled example's unclipped gradient norm, in step order.
    """

    noise_delta: torch.Tensor
    norms: torch.Tensor


@torch.no_grad()
def sgd_step_(
    params: torch.Tensor,
    gradient: torch.Tensor,
    noise: torch.Tensor,
    momentum_buffer: torch.Tensor,
    noise_buffer: torch.Tensor,
    noise_delta: torch.Tensor,
    spec: LocalTrainingSpec,
    active: torch.Tensor | None = None,
) -> None:
    """Apply one ``torch.optim.SGD`` step with gradient ``gradient + noise`` to (K, d) rows.

    ``noise`` is the (already scaled) noise part of the gradient; its direct contribution goes
    through its own momentum buffer into ``noise_delta``. Rows with ``active`` False keep their
    parameters and buffers.
    """
    step = gradient + noise
    if spec.weight_decay != 0:
        step = step + spec.weight_decay * params
    noise_step = noise
    if spec.momentum != 0:
        step = momentum_buffer * spec.momentum + step
        noise_step = noise_buffer * spec.momentum + noise
    if active is None:
        if spec.momentum != 0:
            momentum_buffer.copy_(step)
            noise_buffer.copy_(noise_step)
        params.sub_(step, alpha=spec.lr)
        noise_delta.sub_(noise_step, alpha=spec.lr)
        return
    mask = active.unsqueeze(1)
    if spec.momentum != 0:
        momentum_buffer.copy_(torch.where(mask, step, momentum_buffer))
        noise_buffer.copy_(torch.where(mask, noise_step, noise_buffer))
    params.copy_(torch.where(mask, params - spec.lr * step, params))
    noise_delta.copy_(torch.where(mask, noise_delta - spec.lr * noise_step, noise_delta))


def dp_sgd_update(
    model: nn.Module,
    global_params: torch.Tensor,
    data: ClientData,
    spec: LocalTrainingSpec,
    *,
    clip_norm: float,
    noise_multiplier: float,
    seed: int,
    client_id: int = -1,
    noise_salt: int = 0,
) -> tuple[ClientUpdate, ClientNoise]:
    """Train one client by DP-SGD from ``global_params`` (see module doc); the reference path.

    Args:
        model: Template module (not modified); must pass ``check_per_example_model``.
        global_params: Flat float32 parameters M_t.
        data: The client's training set.
        spec: E, lr, B (the expected batch size), momentum, weight decay.
        clip_norm: C, the per-example L2 clipping norm.
        noise_multiplier: σ, noise std over C.
        seed: The task seed (batches and noise derive from it).
        client_id: Id recorded in the update.
        noise_salt: A release's own noise and batches (``noise_generator``,
            ``batch_generator``); 0: the task seed's.

    Returns:
        The update (delta, n_c, mean loss of the sampled examples) and its ``ClientNoise``.
    """
    check_per_example_model(model)
    if not clip_norm > 0:
        raise ConfigError(f"clip_norm C must be > 0; got {clip_norm}")
    if noise_multiplier < 0:
        raise ConfigError(f"noise multiplier must be >= 0; got {noise_multiplier}")
    layout = ParamLayout(model)
    device = global_params.device
    start = global_params.detach().to(torch.float32).reshape(1, -1)
    params = start.clone()
    momentum_buffer, noise_buffer = torch.zeros_like(params), torch.zeros_like(params)
    noise_delta = torch.zeros_like(params)
    n = len(data)
    batches = poisson_batches(n, spec, batch_generator(seed, noise_salt))
    noises = noise_generator(seed, noise_salt)
    scale = noise_multiplier * clip_norm
    expected = sample_rate(n, spec.batch_size) * n if n else 1.0
    draw = torch.zeros(layout.num_params, dtype=torch.float32)
    norms, loss_sum, seen = [], 0.0, 0
    for idx in batches:
        x, y = data.x[idx].to(device), data.y[idx].to(device)
        summed, norm, losses = per_example_clipped_sum(
            model, layout.views(params[0]), x, y, clip_norm
        )
        if noise_multiplier > 0:  # σ = 0 (clipping only): no draws, the noise stays zero
            draw.normal_(generator=noises)
        noise = (draw.to(device) * (scale / expected)).unsqueeze(0)
        gradient = layout.flatten(summed, 0).unsqueeze(0) / expected
        sgd_step_(params, gradient, noise, momentum_buffer, noise_buffer, noise_delta, spec)
        norms.append(norm)
        loss_sum += float(losses.to(torch.float64).sum())
        seen += len(idx)
    delta = (params - start)[0]
    update = ClientUpdate(
        client_id=client_id,
        delta=delta,
        num_samples=n,
        train_loss=loss_sum / seen if seen else float("nan"),
    )
    all_norms = torch.cat(norms) if norms else torch.zeros(0)
    return update, ClientNoise(noise_delta[0], all_norms.to(torch.float32).cpu())


def check_tasks(client_data: Mapping[int, ClientData], tasks: Sequence[tuple[int, int]]) -> None:
    """Raise ``UnknownClientError`` naming the task clients that have no data here."""
    check_task_clients(tasks, client_data, "this DP-SGD trainer")
