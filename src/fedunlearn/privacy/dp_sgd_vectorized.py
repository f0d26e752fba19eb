"""DP-SGD for all clients of a round at once: ``vmap`` over clients of the ghost-clipped step.

``VectorizedDPSGD`` reproduces ``dp_sgd_update`` (the per-client reference) to float tolerance
for models whose parameters all live in ``nn.Linear`` and ``nn.Conv2d`` layers, running one
batched step for K clients together:

1. Plan: each client's Poisson batches are drawn exactly as the reference draws them
   (``poisson_batches`` with the task's batch generator); a step's batches are padded to that
   step's largest batch with weight-0 rows (one shape per step for ``vmap``), and a client
   whose steps are done is masked (``ceil(E n_c / B)`` differs between clients).
2. Clipped sums: ``vmap(GhostClipping)`` over the stacked clients' parameters
   (:mod:`fedunlearn.privacy.per_example`); real rows carry weight 1/(q n_c), so the sums come
   out divided by the expected batch size, padding rows weight 0.
3. Noise: each active client draws its d-vector from its own noise generator, as the reference
   does, so the draws are identical; inactive clients draw nothing. The draws of different
   clients are independent, so they run on ``torch.get_num_threads()`` threads (the Gaussian
   draws of one client are single-threaded in torch and cost about as much per sample as the
   non-private step of the MLP).
4. Step: without momentum and weight decay, ``p -= lr * grad`` per parameter and
   ``p -= lr * σ C ξ / (q n_c)`` (one fused pass each; done clients have zero gradients and draws
   and do not move); otherwise ``sgd_step_`` on the (K, d) parameters, masked for done clients.

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
from fedunlearn.fl.vectorized import stack_clients
from fedunlearn.models.flat import check_flat
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
from fedunlearn.privacy.per_example import GhostClipping

__all__ = ["VectorizedDPSGD"]

#: Default working-set budget of one chunk of clients.
DEFAULT_CHUNK_BYTES = 512 * 2**20


class VectorizedDPSGD:
    """DP-SGD of many clients in lock-step (see module doc).

    Args:
        model: Template module (all parameters in ``nn.Linear``/``nn.Conv2d`` layers); not
            modified.
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
        self.ghost = GhostClipping(model)
        self.layout = ParamLayout(model)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        if max_chunk_bytes < 1:
            raise ConfigError(f"max_chunk_bytes must be >= 1; got {max_chunk_bytes}")
        self.max_chunk_bytes = int(max_chunk_bytes)
        x, y, self._offsets, self._sizes = stack_clients(client_data, "DP-SGD")
        self._data = client_data
        self._x = x.to(self.device).contiguous()
        self._y = y.to(self.device)
        self._example_shape = tuple(self._x.shape[1:])
        self._example_floats = self._floats_per_example()
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
        noise_salt: int = 0,
    ) -> list[tuple[ClientUpdate, ClientNoise]]:
        """Train every ``(client_id, task_seed)`` task; results in task order.

        ``noise_salt``: a release's own draws, noise and Poisson batches
        (``dp_sgd.noise_generator``, ``dp_sgd.batch_generator``); 0: the task seed's.

        Raises:
            ConfigError: if ``global_params`` is not a flat vector of this model's size.
            UnknownClientError: if a task names a client without data here.
        """
        check_flat(global_params, self.layout.num_params)
        check_tasks(self._data, tasks)
        start = global_params.detach().to(device=self.device, dtype=torch.float32)
        chunk = self._chunk_size(spec)
        out: list[tuple[ClientUpdate, ClientNoise]] = []
        for first in range(0, len(tasks), chunk):
            part = tasks[first : first + chunk]
            out += self._run_chunk(start, part, spec, clip_norm, noise_multiplier, noise_salt)
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
        rows = 2 * spec.batch_size + 16
        per_client = 4 * (
            8 * self.layout.num_params
            + rows * (math.prod(self._example_shape) + self._example_floats)
        )
        return max(1, self.max_chunk_bytes // per_client)

    def _floats_per_example(self) -> int:
        """Floats one example keeps alive in a step (outputs, probes, their gradients, inputs).

        A conv layer also keeps its unfolded input and its per-example weight gradient.
        """
        total = 0
        for layer, shape in zip(
            self.ghost.layers, self.ghost.layer_shapes(self._example_shape), strict=True
        ):
            out = math.prod(shape)
            total += 3 * out
            if isinstance(layer, nn.Conv2d):
                fan_in = layer.weight.numel() // layer.out_channels
                total += fan_in * math.prod(shape[1:]) + layer.weight.numel()
            else:
                total += layer.in_features
        return total

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
        noise_salt: int = 0,
    ) -> list[tuple[ClientUpdate, ClientNoise]]:
        k = len(tasks)
        dev = self.device
        sizes = [self._sizes[cid] for cid, _ in tasks]
        plans = [
            poisson_batches(n, spec, batch_generator(seed, noise_salt))
            for n, (_, seed) in zip(sizes, tasks, strict=True)
        ]
        steps = max((len(p) for p in plans), default=0)
        # 1/(q n_c): row weights carry the division by the expected batch size
        expected = torch.tensor(
            [sample_rate(n, spec.batch_size) * n if n else 1.0 for n in sizes],
            dtype=torch.float32,
        ).unsqueeze(1)
        step_rows, step_weights, step_active = [], [], []
        for s in range(steps):  # each step padded to its own largest batch
            width = max((len(p[s]) for p in plans if s < len(p)), default=0) or 1
            rows = torch.zeros((k, width), dtype=torch.int64)
            weights = torch.zeros((k, width), dtype=torch.float32)
            for i, ((cid, _), plan) in enumerate(zip(tasks, plans, strict=True)):
                offset = self._offsets[cid] if sizes[i] else 0
                rows[i] = offset
                if s < len(plan):
                    rows[i, : len(plan[s])] = plan[s] + offset
                    weights[i, : len(plan[s])] = 1.0
            step_rows.append(rows.view(-1).to(dev))
            step_weights.append((weights / expected).to(dev))
            step_active.append(torch.tensor([s < len(p) for p in plans]))
        expected = expected.to(dev)
        d = self.layout.num_params
        params = start.unsqueeze(0).repeat(k, 1)
        views = self.layout.views(params)
        momentum_buffer, noise_buffer = torch.zeros_like(params), torch.zeros_like(params)
        noise_delta = torch.zeros_like(params)
        generators = [noise_generator(seed, noise_salt) for _, seed in tasks]
        draws = torch.zeros((k, d), dtype=torch.float32)
        coef = noise_multiplier * clip_norm / expected  # noise std on the averaged gradient
        plain_sgd = spec.momentum == 0 and spec.weight_decay == 0
        loss_sums = torch.zeros(k, dtype=torch.float64, device=dev)
        counts = torch.zeros(k, dtype=torch.float64)
        norms_seen: list[list[torch.Tensor]] = [[] for _ in range(k)]
        for s in range(steps):
            width = step_weights[s].shape[1]
            x = self._x.index_select(0, step_rows[s]).view(k, width, *self._example_shape)
            y = self._y.index_select(0, step_rows[s]).view(k, width)
            grads, norms, losses = self._step(views, x, y, step_weights[s], clip_norm)
            now = step_active[s]
            if noise_multiplier > 0:  # σ = 0 (clipping only): no draws, the noise stays zero
                self._draw_noise(draws, generators, now)
            noise = draws.to(dev)
            if plain_sgd:
                # p -= lr (Σ w clip(g) + σ C ξ / (q n)); a client whose steps are done has zero
                # weights and zero draws, so it does not move
                with torch.no_grad():
                    for name in self.layout.names:
                        views[name].sub_(grads[name], alpha=spec.lr)
                    params.addcmul_(noise, coef, value=-spec.lr)
                    noise_delta.addcmul_(noise, coef, value=-spec.lr)
            else:
                sgd_step_(
                    params,
                    self.layout.flatten(grads, 1).detach(),
                    noise * coef,
                    momentum_buffer,
                    noise_buffer,
                    noise_delta,
                    spec,
                    None if bool(now.all()) else now.to(dev),
                )
            real = step_weights[s] > 0
            loss_sums += torch.where(real, losses.detach(), 0.0).sum(dim=1).to(torch.float64)
            counts += real.sum(dim=1).cpu().to(torch.float64)
            norms_cpu, real_cpu = norms.detach().cpu(), real.cpu()
            for i in range(k):
                if now[i]:
                    norms_seen[i].append(norms_cpu[i][real_cpu[i]])
        deltas = params - start
        out = []
        for i, (cid, _) in enumerate(tasks):
            seen = float(counts[i])
            update = ClientUpdate(
                client_id=cid,
                delta=deltas[i],
                num_samples=sizes[i],
                train_loss=float(loss_sums[i]) / seen if seen else float("nan"),
            )
            norms_i = torch.cat(norms_seen[i]) if norms_seen[i] else torch.zeros(0)
            out.append((update, ClientNoise(noise_delta[i].clone(), norms_i)))
        return out
