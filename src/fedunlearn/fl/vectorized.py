"""All clients' local SGD at once: ``torch.func.vmap`` over parameters stacked to shape (K, ...).

``VectorizedExecutor`` reproduces ``local_update`` (the plain per-client loop) to float tolerance
while running one batched forward/backward per step for K clients together:

1. Batch order: one ``torch.Generator`` per task seeded with the task seed draws
   ``randperm(n_k)`` per epoch, exactly as ``local_update`` does; the permutations become global
   row indices into all clients' data stacked once at construction (``index_select`` per step).
2. Lock-step: at step s every client takes its own s-th batch. Batches shorter than
   ``batch_size`` are padded with weight-0 rows and the loss is the mean over real rows; a client
   that has no s-th batch in this epoch is masked (neither its parameters nor its momentum change).
3. Gradients: ``vmap(grad_and_value(loss))`` with ``functional_call`` on the stacked parameters.
4. Optimiser: ``torch.optim.SGD`` arithmetic (weight decay added to the gradient, then momentum,
   whose buffer starts as the first gradient, then ``p -= lr * step``), per client.

Clients are processed in chunks so that K x d x (a few) floats stay within a memory budget
(512 MiB on the CPU, 8 GiB on a GPU; a fixed number per device type, never the free memory of
the moment, so the chunking and hence the numbers do not vary from run to run).

Devices: the stacked data lives on the executor's device from construction on; each round the
batch plan (drawn on the CPU, as in ``local_update``) is copied there once per chunk, every step
runs on the device without a host sync, and the deltas come back to the CPU once per chunk. On
a GPU this is one batched program per step for all K clients (convolutions become grouped
convolutions), under ``cuda_determinism``.
Only models without buffers or in-model randomness are accepted (see ``unsupported_modules``):
``vmap`` cannot update per-client BatchNorm statistics nor reproduce the reference's dropout
masks, so such models raise ``ConfigError`` and belong on the serial or pool executor.

Deviations: [REC] the float results equal ``local_update`` to rounding only (batched kernels sum
in a different order); repeated runs with the same tasks are bit-identical.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap
from torch.nn import functional as F  # noqa: N812

from fedunlearn.errors import ConfigError
from fedunlearn.fl.checked_executor import CheckedExecutor
from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.device import cuda_determinism, resolve_device, sum_dtype
from fedunlearn.fl.records import ClientData, ClientUpdate
from fedunlearn.fl.sampling import step_batches
from fedunlearn.fl.seeding import torch_generator
from fedunlearn.models.flat import num_params

__all__ = ["VectorizedExecutor", "stack_clients", "unsupported_modules"]

#: Default working-set budget of one chunk of clients (parameters, gradients, momentum, batch).
DEFAULT_CHUNK_BYTES = 512 * 2**20
#: The same on a GPU (activations of the batched step come on top of the estimate).
DEFAULT_GPU_CHUNK_BYTES = 8 * 2**30

_RANDOM_OR_STATEFUL = (
    nn.modules.dropout._DropoutNd,
    nn.modules.batchnorm._NormBase,  # BatchNorm*, InstanceNorm*: running statistics
    nn.RReLU,
)


def unsupported_modules(model: nn.Module) -> list[str]:
    """Return why ``model`` cannot be vectorised (empty if it can).

    A model can be vectorised when it has float32 trainable parameters, no buffers and no module
    whose training-mode forward is random or updates state (dropout, batch/instance norm, RReLU).
    A custom ``forward`` that draws random numbers itself cannot be detected; don't vectorise it.
    """
    reasons = [
        f"{name or type(model).__name__} ({type(module).__name__}: random or stateful in training)"
        for name, module in model.named_modules()
        if isinstance(module, _RANDOM_OR_STATEFUL)
    ]
    reasons += [f"buffer '{name}'" for name, _ in model.named_buffers()]
    reasons += [
        f"parameter '{name}' is {p.dtype}, not torch.float32"
        for name, p in model.named_parameters()
        if p.dtype != torch.float32
    ]
    if num_params(model) == 0:
        reasons.append("no trainable parameters")
    return reasons


class VectorizedExecutor(CheckedExecutor):
    """Train many clients in lock-step with ``vmap`` over stacked parameters (see module doc).

    Args:
        model: Template module; only its structure is used and it is not modified.
        client_data: Every client's training set; all ``x`` share one dtype and example shape.
        max_chunk_bytes: Working-set budget of one chunk of clients trained together (default:
            ``DEFAULT_CHUNK_BYTES`` on the CPU, ``DEFAULT_GPU_CHUNK_BYTES`` on a GPU).
        device: Where to train (default CPU); the stacked data is copied there once, here.

    Raises:
        ConfigError: if the model has dropout, normalisation statistics, other buffers or
            non-float32 parameters, or the clients' inputs do not stack.
    """

    name = "vectorized"

    def __init__(
        self,
        model: nn.Module,
        client_data: Mapping[int, ClientData],
        max_chunk_bytes: int | None = None,
        device: str | torch.device | None = None,
    ) -> None:
        self.device = resolve_device(device)
        if max_chunk_bytes is None:
            gpu = self.device.type != "cpu"
            max_chunk_bytes = DEFAULT_GPU_CHUNK_BYTES if gpu else DEFAULT_CHUNK_BYTES
        reasons = unsupported_modules(model)
        if reasons:
            raise ConfigError(
                f"the vectorized executor cannot train {type(model).__name__}: "
                f"{'; '.join(reasons)}. Use executor 'serial' or 'pool' for this model."
            )
        if max_chunk_bytes < 1:
            raise ConfigError(f"max_chunk_bytes must be >= 1; got {max_chunk_bytes}")
        self.model = copy.deepcopy(model).to(self.device)  # functional_call's structure
        self.max_chunk_bytes = int(max_chunk_bytes)
        self._names = [name for name, _ in model.named_parameters()]
        self._shapes = [p.shape for _, p in model.named_parameters()]
        self._num_params = num_params(model)
        x, y, self._offsets, self._sizes = stack_clients(client_data)
        self._sample_ids = {cid: d.sample_ids().cpu().numpy() for cid, d in client_data.items()}
        self._x, self._y = x.to(self.device), y.to(self.device)
        self._step = vmap(grad_and_value(self._batch_loss))

    def _batch_loss(
        self,
        params: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        row_weights: torch.Tensor,
    ) -> torch.Tensor:
        """One client's batch loss: cross-entropy weighted 1/m on real rows, 0 on padding."""
        logits = functional_call(self.model, params, (x,))
        return (F.cross_entropy(logits, y, reduction="none") * row_weights).sum()

    def _train(
        self, global_params: torch.Tensor, tasks: Sequence[tuple[int, int]], spec: LocalTrainingSpec
    ) -> list[ClientUpdate]:
        """Train the tasks chunk by chunk (``CheckedExecutor.run`` checked them)."""
        global_params = global_params.detach().to(torch.float32)
        chunk = self._chunk_size(spec)
        updates: list[ClientUpdate] = []
        with cuda_determinism(self.device):
            for start in range(0, len(tasks), chunk):
                updates += self._run_chunk(global_params, tasks[start : start + chunk], spec)
        return updates

    def start(self) -> None:
        """Nothing to start: the data was stacked when this executor was built."""

    def close(self) -> None:
        """Nothing to release."""

    def _chunk_size(self, spec: LocalTrainingSpec) -> int:
        """Clients per chunk: params, grads, momentum, scratch (5 x d) and one padded batch."""
        example_numel = math.prod(self._x.shape[1:])
        width = _padded_width(spec, list(self._sizes.values()))
        per_client = 4 * (5 * self._num_params + 2 * width * example_numel)
        return max(1, self.max_chunk_bytes // per_client)

    def _run_chunk(
        self,
        global_params: torch.Tensor,
        tasks: Sequence[tuple[int, int]],
        spec: LocalTrainingSpec,
    ) -> list[ClientUpdate]:
        """Train one chunk of K clients in lock-step and return their updates."""
        k = len(tasks)
        sizes = [self._sizes[cid] for cid, _ in tasks]
        offsets = [self._offsets[cid] for cid, _ in tasks]
        seeds = [seed for _, seed in tasks]
        if spec.steps is None:
            rows, row_weights, counts, active = _batch_plan(offsets, sizes, seeds, spec)
        else:
            ids = [self._sample_ids[cid] for cid, _ in tasks]
            rows, row_weights, counts, active = _step_plan(offsets, ids, seeds, spec)
        device = self.device
        accumulate = sum_dtype(device)
        # the plan is built on the CPU; copy it to the device once (active stays on the CPU too,
        # so that asking whether a step is complete never waits for the device)
        rows_d, weights_d = rows.to(device), row_weights.to(device)
        counts_d, active_d = counts.to(device=device, dtype=accumulate), active.to(device)
        start = global_params.to(device)
        params = self._stacked(start, k)
        names = self._names
        momentum_buffers = [torch.zeros_like(p) for p in params.values()]
        loss_sums = torch.zeros(k, dtype=accumulate, device=device)
        batch = rows.shape[1] // k  # the padded width (``_padded_width``)
        example_shape = self._x.shape[1:]
        for step in range(rows.shape[0]):
            x = self._x.index_select(0, rows_d[step]).view(k, batch, *example_shape)
            y = self._y.index_select(0, rows_d[step]).view(k, batch)
            grads, losses = self._step(params, x, y, weights_d[step])
            _sgd_step_(
                [params[n] for n in names],
                [grads[n] for n in names],
                momentum_buffers,
                spec,
                None if bool(active[step].all()) else active_d[step],
            )
            loss_sums += losses.detach().to(accumulate) * counts_d[step]
        flat = torch.cat([params[n].reshape(k, -1) for n in names], dim=1)
        deltas = (flat - start).cpu()
        loss_sums = loss_sums.to(device="cpu", dtype=torch.float64)
        seen = counts.sum(dim=0)
        return [
            ClientUpdate(
                client_id=cid,
                delta=deltas[i],
                num_samples=sizes[i],
                train_loss=float(loss_sums[i] / seen[i]) if seen[i] > 0 else float("nan"),
            )
            for i, (cid, _) in enumerate(tasks)
        ]

    def _stacked(self, global_params: torch.Tensor, k: int) -> dict[str, torch.Tensor]:
        """Split the flat vector into named parameters, each repeated to shape (K, ...)."""
        params: dict[str, torch.Tensor] = {}
        offset = 0
        for name, shape in zip(self._names, self._shapes, strict=True):
            numel = math.prod(shape)
            piece = global_params[offset : offset + numel].view(shape)
            params[name] = piece.unsqueeze(0).expand(k, *shape).clone()
            offset += numel
        return params


def stack_clients(
    client_data: Mapping[int, ClientData], user: str = "the vectorized executor"
) -> tuple[torch.Tensor, torch.Tensor, dict[int, int], dict[int, int]]:
    """Concatenate all clients' data once; return x, y, each client's first row and size.

    x is contiguous, y int64; with no rows at all, one zero row keeps row 0 addressable for
    padding.

    Raises:
        ConfigError: if ``client_data`` is empty (naming ``user``, who needs a client) or the
            clients' inputs differ in example shape or dtype.
    """
    if not client_data:
        raise ConfigError(f"client_data is empty; {user} needs at least one client")
    shapes = {tuple(d.x.shape[1:]) for d in client_data.values()}
    dtypes = {d.x.dtype for d in client_data.values()}
    if len(shapes) != 1 or len(dtypes) != 1:
        raise ConfigError(
            f"clients' inputs must share one example shape and dtype to be stacked; got shapes "
            f"{sorted(shapes)} and dtypes {sorted(map(str, dtypes))}"
        )
    ids = list(client_data)
    sizes = {cid: len(client_data[cid]) for cid in ids}
    offsets, start = {}, 0
    for cid in ids:
        offsets[cid] = start
        start += sizes[cid]
    x = torch.cat([client_data[cid].x for cid in ids]).contiguous()
    y = torch.cat([client_data[cid].y.to(torch.int64) for cid in ids])
    if x.shape[0] == 0:  # keep row 0 addressable for padding
        x, y = torch.zeros((1, *x.shape[1:]), dtype=x.dtype), torch.zeros(1, dtype=torch.int64)
    return x, y, offsets, sizes


def _padded_width(spec: LocalTrainingSpec, sizes: Sequence[int]) -> int:
    """The batch width a step pads to: ``batch_size``, or the largest client's size if smaller.

    A batch cannot hold more rows than its client has, so a ``batch_size`` above every
    client's size trains each on its whole data per step (as ``local_update`` does) without
    allocating ``batch_size`` padding rows per client (``batch_size: 100000000`` asked for
    tens of GB).
    """
    return max(1, min(spec.batch_size, max(sizes, default=1)))


def _batch_plan(
    offsets: Sequence[int], sizes: Sequence[int], seeds: Sequence[int], spec: LocalTrainingSpec
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Precompute every step's rows for K clients in lock-step.

    A client with no data takes one empty step per epoch, as ``local_update`` does (its
    ``randperm(0)`` splits into one empty batch): zero gradient, but weight decay still applies.

    Returns:
        ``rows`` (T, K * B) int64 indices into the stacked data (padding points at the client's
        first row, or row 0), ``row_weights`` (T, K, B) float32 equal to 1/m on the m real rows
        of a batch and 0 on padding, ``counts`` (T, K) float64 real rows per client and step,
        and ``active`` (T, K) bool, where T = epochs x (most batches any client has per epoch).
    """
    batch = _padded_width(spec, sizes)
    k = len(sizes)
    client_steps = [max(1, -(-n // batch)) for n in sizes]  # ceil(n / B), at least one
    steps = max(client_steps, default=0)
    total = spec.epochs * steps
    rows = torch.zeros((total, k, batch), dtype=torch.int64)
    row_weights = torch.zeros((total, k, batch), dtype=torch.float32)
    counts = torch.zeros((total, k), dtype=torch.float64)
    active = torch.zeros((total, k), dtype=torch.bool)
    for i, (offset, n, seed) in enumerate(zip(offsets, sizes, seeds, strict=True)):
        generator = torch_generator(seed)  # same draws as local_update: randperm(n) per epoch
        num = client_steps[i]
        pad_row = offset if n else 0  # an empty client's offset may be one past the end
        rows[:, i, :] = pad_row
        padded = torch.full((num * batch,), pad_row, dtype=torch.int64)
        real = torch.zeros(num * batch, dtype=torch.float32)
        real[:n] = 1.0
        per_batch = real.view(num, batch).sum(dim=1)
        weights = real.view(num, batch) / per_batch.clamp_min(1.0).unsqueeze(1)
        for epoch in range(spec.epochs):
            padded[:n] = torch.randperm(n, generator=generator) + offset
            first = epoch * steps
            rows[first : first + num, i] = padded.view(num, batch)
            row_weights[first : first + num, i] = weights
            counts[first : first + num, i] = per_batch.to(torch.float64)
            active[first : first + num, i] = True
    return rows.view(total, k * batch), row_weights, counts, active


def _step_plan(
    offsets: Sequence[int],
    sample_ids: Sequence[np.ndarray],
    seeds: Sequence[int],
    spec: LocalTrainingSpec,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_batch_plan`` for step mode: ``spec.steps`` full batches per client, no padding.

    Each client's step i takes the rows ``fl.sampling.step_batches`` chooses, as in
    ``local_update``; every batch holds exactly ``batch_size`` real rows.
    """
    assert spec.steps is not None
    batch, k, total = spec.batch_size, len(offsets), spec.steps
    rows = torch.empty((total, k, batch), dtype=torch.int64)
    for i, (offset, ids, seed) in enumerate(zip(offsets, sample_ids, seeds, strict=True)):
        plan = step_batches(seed, ids, batch, total)
        rows[:, i, :] = torch.from_numpy(np.stack(plan)) + offset
    row_weights = torch.full((total, k, batch), 1.0 / batch, dtype=torch.float32)
    counts = torch.full((total, k), float(batch), dtype=torch.float64)
    active = torch.ones((total, k), dtype=torch.bool)
    return rows.view(total, k * batch), row_weights, counts, active


@torch.no_grad()
def _sgd_step_(
    params: list[torch.Tensor],
    grads: list[torch.Tensor] | tuple[torch.Tensor, ...],  # _foreach_add's result is typed tuple
    momentum_buffers: list[torch.Tensor],
    spec: LocalTrainingSpec,
    active: torch.Tensor | None,
) -> None:
    """Apply one ``torch.optim.SGD`` step in place to every client (or only ``active`` ones).

    Follows ``torch.optim.SGD`` (dampening 0, no Nesterov): ``g += weight_decay * p``;
    ``buf = momentum * buf + g`` (a zero buffer makes the first step ``buf = g`` exactly, as
    SGD's clone of the first gradient); ``p -= lr * buf``.
    """
    if spec.weight_decay != 0:
        grads = torch._foreach_add(grads, params, alpha=spec.weight_decay)
    if active is None:
        if spec.momentum != 0:
            torch._foreach_mul_(momentum_buffers, spec.momentum)
            torch._foreach_add_(momentum_buffers, grads)
            grads = momentum_buffers
        torch._foreach_add_(params, grads, alpha=-spec.lr)
        return
    for p, g, buf in zip(params, grads, momentum_buffers, strict=True):
        mask = active.view(-1, *([1] * (p.ndim - 1)))
        if spec.momentum != 0:
            buf.copy_(torch.where(mask, buf * spec.momentum + g, buf))
            g = buf
        p.copy_(torch.where(mask, p.add(g, alpha=-spec.lr), p))
