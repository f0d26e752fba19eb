"""DP-SGD for all clients of a round at once: ``vmap`` over clients of the ghost-clipped step.

``VectorizedDPSGD`` reproduces ``dp_sgd_update`` (the per-client reference) to float tolerance
for models whose parameters all live in ``nn.Linear`` layers, running one batched step for K
clients together:

1. Plan: each client's Poisson batches are drawn exactly as the reference draws them
   (``poisson_batches`` with the task's batch generator); a step's batches are padded to the
   largest batch of the chunk with weight-0 rows (a fixed shape for ``vmap``), and a client
   whose steps are done is masked (``ceil(E n_c / B)`` differs between clients).
2. Clipped sums: ``vmap(LinearGhostClipping)`` over the stacked clients' parameters
   (:mod:`fedunlearn.privacy.per_example`); padding rows carry weight 0.
3. Noise: each active client draws its d-vector from its own noise generator, as the reference
   does, so the draws are identical; inactive clients draw nothing. The draws of different
   clients are independent, so they run on ``torch.get_num_threads()`` threads (the Gaussian
   draws of one client are single-threaded in torch and cost about as much per sample as the
   non-private step of the MLP).
4. Step: ``sgd_step_`` on the (K, d) parameters, masked for inactive clients.

Clients are processed in chunks that keep K x (a few d + one padded batch's activations) within
a memory budget.

Deviations: [REC] results equal the reference to rounding only (batched kernels sum in a different
order); repeated runs with the same tasks are bit-identical.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn
from torch.func import vmap

from fedunlearn.errors import ConfigError
from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.records import ClientData, ClientUpdate
from fedunlearn.privacy.dp_sgd import (
    ClientNoise,
    ParamLayout,
    batch_generator,
    check_tasks,
    noise_generator,
    poisson_batches,
    sample_rate,
    sgd_step_,
)
from fedunlearn.privacy.per_example import LinearGhostClipping

__all__ = ["VectorizedDPSGD"]

#: Default working-set budget of one chunk of clients.
DEFAULT_CHUNK_BYTES = 512 * 2**20


class VectorizedDPSGD:
    """DP-SGD of many clients in lock-step (see module doc).

    Args:
        model: Template module (all parameters in ``nn.Linear`` layers); not modified.
        client_data: Every client's training set; inputs share one example shape and dtype.
        device: Where training runs (default: CPU); data is moved there once.
        max_chunk_bytes: Working-set budget of one chunk of clients trained together.

    Raises:
        ConfigError: if the model cannot be ghost-clipped or the inputs do not stack.
    """

    def __init__(
        self,
        model: nn.Module,
        client_data: Mapping[int, ClientData],
        *,
        device: torch.device | str | None = None,
        max_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        self.ghost = LinearGhostClipping(model)
        self.layout = ParamLayout(model)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        if max_chunk_bytes < 1:
            raise ConfigError(f"max_chunk_bytes must be >= 1; got {max_chunk_bytes}")
        self.max_chunk_bytes = int(max_chunk_bytes)
        if not client_data:
            raise ConfigError("client_data is empty; DP-SGD needs at least one client")
        shapes = {tuple(d.x.shape[1:]) for d in client_data.values()}
        dtypes = {d.x.dtype for d in client_data.values()}
        if len(shapes) != 1 or len(dtypes) != 1:
            raise ConfigError(
                f"clients' inputs must share one example shape and dtype to be stacked; got "
                f"shapes {sorted(shapes)} and dtypes {sorted(map(str, dtypes))}"
            )
        self._data = client_data
        ids = list(client_data)
        self._sizes = {cid: len(client_data[cid]) for cid in ids}
        self._offsets: dict[int, int] = {}
        start = 0
        for cid in ids:
            self._offsets[cid] = start
            start += self._sizes[cid]
        x = torch.cat([client_data[cid].x for cid in ids])
        y = torch.cat([client_data[cid].y.to(torch.int64) for cid in ids])
        if x.shape[0] == 0:  # keep row 0 addressable for padding
            x = torch.zeros((1, *x.shape[1:]), dtype=x.dtype)
            y = torch.zeros(1, dtype=torch.int64)
        self._x = x.to(self.device).contiguous()
        self._y = y.to(self.device)
        self._example_shape = tuple(self._x.shape[1:])
        self._step = vmap(self.ghost, in_dims=(0, 0, 0, 0, None))
        self._pool: ThreadPoolExecutor | None = None
        self._pool_threads = 0

    def run(
        self,
        global_params: torch.Tensor,
        tasks: Sequence[tuple[int, int]],
        spec: LocalTrainingSpec,
        *,
        clip_norm: float,
        noise_multiplier: float,
    ) -> list[tuple[ClientUpdate, ClientNoise]]:
        """Train every ``(client_id, task_seed)`` task; results in task order.

        Raises:
            ConfigError: if ``global_params`` is not a flat vector of this model's size.
            UnknownClientError: if a task names a client without data here.
        """
        d = self.layout.num_params
        if global_params.ndim != 1 or global_params.numel() != d:
            raise ConfigError(
                f"flat parameter vector has shape {tuple(global_params.shape)}; "
                f"this model needs ({d},)"
            )
        check_tasks(self._data, tasks)
        start = global_params.detach().to(device=self.device, dtype=torch.float32)
        chunk = self._chunk_size(spec)
        out: list[tuple[ClientUpdate, ClientNoise]] = []
        for first in range(0, len(tasks), chunk):
            part = tasks[first : first + chunk]
            out += self._run_chunk(start, part, spec, clip_norm, noise_multiplier)
        return [
            (
                ClientUpdate(
                    u.client_id, u.delta.to(global_params.device), u.num_samples, u.train_loss
                ),
                noise,
            )
            for u, noise in out
        ]

    def _chunk_size(self, spec: LocalTrainingSpec) -> int:
        """Clients per chunk: 8 d-vectors and two padded batches' inputs and activations."""
        widths = sum(layer.in_features + layer.out_features for layer in self.ghost.layers)
        rows = 2 * spec.batch_size + 16
        per_client = 4 * (
            8 * self.layout.num_params + rows * (math.prod(self._example_shape) + 3 * widths)
        )
        return max(1, self.max_chunk_bytes // per_client)

    def _draw_noise(
        self, draws: torch.Tensor, generators: list[torch.Generator], active: torch.Tensor
    ) -> None:
        """Fill row i of ``draws`` from ``generators[i]`` (zeros where not ``active``)."""

        def draw(i: int) -> None:
            if active[i]:
                draws[i].normal_(generator=generators[i])
            else:
                draws[i].zero_()

        threads = min(torch.get_num_threads(), len(generators))
        if threads <= 1:
            for i in range(len(generators)):
                draw(i)
            return
        if self._pool is None or self._pool_threads != threads:
            self.close()
            self._pool = ThreadPoolExecutor(threads, thread_name_prefix="dp-sgd-noise")
            self._pool_threads = threads
        list(self._pool.map(draw, range(len(generators))))

    def close(self) -> None:
        """Stop the noise threads, if any."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def _run_chunk(
        self,
        start: torch.Tensor,
        tasks: Sequence[tuple[int, int]],
        spec: LocalTrainingSpec,
        clip_norm: float,
        noise_multiplier: float,
    ) -> list[tuple[ClientUpdate, ClientNoise]]:
        k = len(tasks)
        sizes = [self._sizes[cid] for cid, _ in tasks]
        plans = [
            poisson_batches(n, spec, batch_generator(seed))
            for n, (_, seed) in zip(sizes, tasks, strict=True)
        ]
        steps = max((len(p) for p in plans), default=0)
        width = max((len(idx) for p in plans for idx in p), default=0) or 1
        rows = torch.zeros((steps, k, width), dtype=torch.int64)
        weights = torch.zeros((steps, k, width), dtype=torch.float32)
        active = torch.zeros((steps, k), dtype=torch.bool)
        for i, ((cid, _), plan) in enumerate(zip(tasks, plans, strict=True)):
            offset = self._offsets[cid]
            rows[:, i, :] = offset if sizes[i] else 0
            for s, idx in enumerate(plan):
                rows[s, i, : len(idx)] = idx + offset
                weights[s, i, : len(idx)] = 1.0
                active[s, i] = True
        dev = self.device
        rows, weights = rows.to(dev), weights.to(dev)
        expected = torch.tensor(
            [sample_rate(n, spec.batch_size) * n if n else 1.0 for n in sizes],
            dtype=torch.float32,
            device=dev,
        ).unsqueeze(1)
        d = self.layout.num_params
        params = start.unsqueeze(0).repeat(k, 1)
        momentum_buffer, noise_buffer = torch.zeros_like(params), torch.zeros_like(params)
        noise_delta = torch.zeros_like(params)
        generators = [noise_generator(seed) for _, seed in tasks]
        draws = torch.zeros((k, d), dtype=torch.float32)
        scale = noise_multiplier * clip_norm
        loss_sums = torch.zeros(k, dtype=torch.float64, device=dev)
        counts = weights.sum(dim=2).sum(dim=0).to(torch.float64)
        all_norms = torch.zeros((steps, k, width), dtype=torch.float32, device=dev)
        for s in range(steps):
            flat_rows = rows[s].reshape(-1)
            x = self._x.index_select(0, flat_rows).view(k, width, *self._example_shape)
            y = self._y.index_select(0, flat_rows).view(k, width)
            grads, norms, losses = self._step(
                self.layout.views(params), x, y, weights[s], clip_norm
            )
            now = active[s]
            self._draw_noise(draws, generators, now)
            noise = draws.to(dev) * (scale / expected)
            gradient = self.layout.flatten(grads, 1) / expected
            sgd_step_(
                params,
                gradient.detach(),
                noise,
                momentum_buffer,
                noise_buffer,
                noise_delta,
                spec,
                None if bool(now.all()) else now.to(dev),
            )
            loss_sums += (losses.detach() * weights[s]).sum(dim=1).to(torch.float64)
            all_norms[s] = norms.detach()
        deltas = params - start
        mask = weights > 0
        out = []
        for i, (cid, _) in enumerate(tasks):
            seen = float(counts[i])
            update = ClientUpdate(
                client_id=cid,
                delta=deltas[i],
                num_samples=sizes[i],
                train_loss=float(loss_sums[i]) / seen if seen else float("nan"),
            )
            norms_i = all_norms[:, i][mask[:, i]].cpu()
            out.append((update, ClientNoise(noise_delta[i].clone(), norms_i)))
        return out
