"""Executors run many clients' ``local_update`` for one round and return their updates.

An executor is built once per federation with the model template and every client's data, then
``run(global_params, tasks, spec)`` is called each round with ``(client_id, seed)`` tasks. The
serial executor is the reference; faster ones must give the same numbers (to float tolerance):
``VectorizedExecutor`` (``fl/vectorized.py``) and ``WorkerPoolExecutor`` (``fl/pool.py``).
``make_executor`` builds one by name; ``auto`` picks by model structure, never by timing, so one
config on one machine always gives bit-identical results.

The ``auto`` rule (``select_executor``); the reason, measured on this project's 2-core Xeon
(AVX-512, 199 GFLOP/s float32 matmul) with 20 MNIST clients x 3000 samples, batch 64, one epoch
(``benchmarks/bench_local_training.py``, medians of 5 interleaved rounds, 2026-11-22):

- every parameterised layer is ``nn.Linear`` and the model passes ``unsupported_modules`` (no
  dropout, normalisation statistics or buffers) -> ``vectorized``. The plain loop spends these
  models' time in per-step overhead that one batched step for all clients removes: logistic
  regression 96k -> 266k samples/s (2.8x; the pool reaches 1.6x), MLP 784-128-10 57k -> 118k
  (2.1x; pool 1.7x).
- anything else (convolutions, embeddings, dropout, ...) -> ``pool`` when more than one CPU is
  available, else ``serial``. For the MNIST CNN, vmapped clients become grouped convolutions
  (0.8x of the plain loop), while two single-threaded channels-last workers reach 3,760
  samples/s against the plain loop's 2,660 (1.4x; 48% of the matmul speed).

On a GPU (``device`` cuda or mps) the rule is different: one batched program for all clients of
a round is what a GPU is for, so ``auto`` -> ``vectorized`` for every model it can train (the
CNN included: grouped convolutions are cuDNN's bread and butter), else ``serial`` on the GPU.
The pool's workers are CPU processes: ``pool`` with device ``auto`` trains on the CPU (an
explicit ``pool`` is a request for CPU workers), ``pool`` with a GPU device is refused. Executors
put the clients' data on the device once, when they are built.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Protocol

import torch
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.fl.client import LocalTrainingSpec, local_update
from fedunlearn.fl.device import resolve_device
from fedunlearn.fl.pool import WorkerPoolExecutor, available_cpus
from fedunlearn.fl.records import ClientData, ClientUpdate
from fedunlearn.fl.vectorized import VectorizedExecutor, unsupported_modules

EXECUTOR_KINDS = ("auto", "serial", "vectorized", "pool")

ClientTask = tuple[int, int]  # (client_id, seed)


class Executor(Protocol):
    """Runs local training for a set of clients from the same global model."""

    name: str

    def run(
        self, global_params: torch.Tensor, tasks: Sequence[ClientTask], spec: LocalTrainingSpec
    ) -> list[ClientUpdate]:
        """Return one update per task, in task order."""
        ...

    def start(self) -> object:
        """Do the one-time setup now (e.g. start workers), not on the first ``run``.

        ``Federation.start`` calls it before a method's clock starts; a no-op for the
        in-process executors. An executor without ``start`` still works (nothing is started).
        """
        ...

    def close(self) -> None:
        """Release workers, if any."""
        ...


class SerialExecutor:
    """The plain per-client loop in this process: the reference for every faster executor.

    Args:
        model: Template module shared by all clients.
        client_data: Every client's training set, keyed by client id.
        device: Where to train (default CPU); the data is copied there once, here.
    """

    name = "serial"

    def __init__(
        self,
        model: nn.Module,
        client_data: Mapping[int, ClientData],
        device: str | torch.device | None = None,
    ) -> None:
        self.model = model
        self.device = resolve_device(device)
        self.client_data = {cid: _placed(data, self.device) for cid, data in client_data.items()}

    def run(
        self, global_params: torch.Tensor, tasks: Sequence[ClientTask], spec: LocalTrainingSpec
    ) -> list[ClientUpdate]:
        """Train each client in turn."""
        return [
            local_update(self.model, global_params, self.client_data[cid], spec, seed, cid)
            for cid, seed in tasks
        ]

    def start(self) -> None:
        """Nothing to start: the data was placed when this executor was built."""

    def close(self) -> None:
        """Nothing to release."""


def _placed(data: ClientData, device: torch.device) -> ClientData:
    """Return ``data`` on ``device`` (the same object when it is already there)."""
    if data.x.device == device and data.y.device == device:
        return data
    return ClientData(data.x.to(device), data.y.to(device), data.ids)


def executor_device(kind: str, device: str | torch.device | None) -> torch.device:
    """Return where executor ``kind`` trains for the requested ``device``.

    ``device`` resolves through ``fl.device.resolve_device``, except that ``pool`` with ``auto``
    means the CPU: its workers are CPU processes.
    """
    if kind == "pool" and (device is None or str(device) == "auto"):
        return torch.device("cpu")
    return resolve_device(device)


def select_executor(
    model: nn.Module, cpus: int | None = None, device: str | torch.device | None = None
) -> str:
    """Return the executor kind ``auto`` means for ``model``: a function of its structure.

    Args:
        model: The model template.
        cpus: CPUs available; defaults to this process's CPU affinity.
        device: Where training runs (default CPU).

    Returns:
        On the CPU: ``"vectorized"`` if every module holding parameters is ``nn.Linear`` and
        the model can be vectorised; otherwise ``"pool"`` if more than one CPU is available,
        else ``"serial"``. On a GPU: ``"vectorized"`` if the model can be vectorised, else
        ``"serial"``.
    """
    if resolve_device(device).type != "cpu":
        return "serial" if unsupported_modules(model) else "vectorized"
    owners = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
    if owners and all(isinstance(m, nn.Linear) for m in owners) and not unsupported_modules(model):
        return "vectorized"
    return "pool" if (available_cpus() if cpus is None else cpus) > 1 else "serial"


def make_executor(
    model: nn.Module,
    client_data: Mapping[int, ClientData],
    kind: str = "auto",
    num_workers: int | None = None,
    device: str | torch.device | None = None,
) -> Executor:
    """Build the executor ``kind`` (``auto`` resolves through ``select_executor``).

    Args:
        model: Template module shared by all clients.
        client_data: Every client's training set, keyed by client id.
        kind: ``auto``, ``serial``, ``vectorized`` or ``pool``.
        num_workers: Worker processes of the pool executor (default: available CPUs); with
            ``auto``, ``num_workers=1`` rules the pool out.
        device: Where local training runs: ``auto``, ``cpu``, ``cuda[:i]``, ``mps`` or a
            ``torch.device`` (default CPU; ``fl.device``).

    Raises:
        ConfigError: if ``kind`` is unknown, ``vectorized`` is asked for a model it cannot
            train, ``pool`` is asked with a GPU device, or the device is not available.
    """
    if kind not in EXECUTOR_KINDS:
        raise ConfigError(f"unknown executor '{kind}'; available: {', '.join(EXECUTOR_KINDS)}")
    where = executor_device(kind, device)
    if kind == "auto":
        kind = select_executor(model, cpus=num_workers, device=where)
    if kind == "pool" and where.type != "cpu":
        raise ConfigError(
            f"executor 'pool' trains in CPU worker processes and cannot use device '{where}'; "
            "use executor 'vectorized' or 'serial' (or 'auto') with a GPU, or device 'cpu'"
        )
    if kind == "pool":
        return WorkerPoolExecutor(model, client_data, num_workers)  # its workers preload it
    preload_lazy_imports()
    if kind == "vectorized":
        return VectorizedExecutor(model, client_data, device=where)
    return SerialExecutor(model, client_data, device=where)


def preload_lazy_imports() -> None:
    """Import now what torch imports on the first training step of a process.

    functorch's ``grad`` (the vectorized executor) and ``optimizer.step()`` (the serial one)
    import ``torch._dynamo`` the first time they run: 1-3 s on a 2-core box. Built lazily, that
    import lands inside whatever trains first, so in a ``compare`` Retrain, which runs first,
    was charged it and every other method's wall-time ratio looked better than it was. An
    executor is built once per federation, before a method's clock starts
    (``UnlearnSession.context``), and the import goes with it (a no-op once imported).
    """
    importlib.import_module("torch._dynamo")
