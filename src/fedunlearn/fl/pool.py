"""Local training in a pool of single-threaded worker processes.

``WorkerPoolExecutor`` starts ``num_workers`` processes with the ``forkserver`` method: each
worker is forked from a clean server process that has imported torch but never run a kernel, so
no OpenMP or MKL thread state is forked, and a worker starts in well under a second (``spawn``,
the fallback where there is no forkserver, re-imports torch per worker). Each worker is
initialised once with the model template and every client's data (sent as numpy arrays) and
limits torch to one thread; per round
only ``(global_params, client_id, seed, spec)`` travels to a worker, which calls the reference
``local_update`` and sends back the delta. Results come back in task order. A worker that dies
makes ``run`` raise ``FedUnlearnError`` (never hang); workers exit if the parent process dies.

By default the workers keep 4-D parameters channels-last (``channels_last=True``), so
convolutions and max-pooling run on NHWC activations: CPU max-pooling of NCHW tensors is an order
of magnitude slower (11 ms against 1 ms for the CNN's first pooling of a batch of 64); two
workers train the MNIST CNN at 3,760 samples/s channels-last against 3,250 NCHW. Workers also
keep freed memory mapped (``_keep_freed_memory``). Neither changes the math; see
``benchmarks/bench_local_training.py``.

Deviations: [REC] a worker's kernels run single-threaded (and channels-last), so results equal
the serial executor's (torch's default threads, NCHW) to rounding, not bit for bit; they are
bit-identical from run to run and whichever worker takes a task, and with
``channels_last=False`` bit-identical to the serial executor run with one torch thread.
"""

from __future__ import annotations

import copy
import ctypes
import multiprocessing
import os
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import ProcessPoolExecutor as _ProcessPool
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np
import torch
from torch import nn

from fedunlearn.errors import ConfigError, FedUnlearnError
from fedunlearn.fl.checked_executor import CheckedExecutor
from fedunlearn.fl.client import LocalTrainingSpec, local_update
from fedunlearn.fl.closing import Closing
from fedunlearn.fl.records import ClientData, ClientUpdate
from fedunlearn.models.flat import num_params

__all__ = ["WorkerPoolExecutor", "available_cpus"]

_ClientArrays = dict[int, tuple[np.ndarray, np.ndarray, np.ndarray | None]]

# State of a worker process, set once by ``_init_worker`` (never used in the parent process).
_worker_model: nn.Module | None = None
_worker_data: dict[int, ClientData] = {}


def available_cpus() -> int:
    """Return the number of CPUs this process may run on (its affinity mask, else cpu_count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _start_context() -> multiprocessing.context.BaseContext:
    """Return the forkserver context, else spawn.

    The server preloads this module (hence torch) and ``torch._dynamo``, which the first
    ``optimizer.step()`` imports (3 s); preloading only imports, it runs no kernel. The list takes
    effect when the server first starts; modules that fail to import are skipped.
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__, "torch._dynamo"])
    return context


def _keep_freed_memory() -> None:
    """Ask glibc's malloc to keep freed memory (up to 32 MiB blocks) instead of unmapping it.

    Training frees and re-allocates the same few-MB activations every step; returning them to
    the OS costs page faults on the next step. Measured on the MNIST CNN: one worker 10-20%
    faster (noisy), two concurrent workers no clear change. Results are unaffected. No-op off
    glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # from <malloc.h>
    libc.mallopt(m_mmap_threshold, 32 * 2**20)  # glibc's maximum
    libc.mallopt(m_trim_threshold, 2**30)


def _is_alive(pid: int) -> bool:
    """Return whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _exit_with_owner(owner_pid: int) -> None:
    """Poll the executor's process and end this worker once it is gone (no orphaned workers).

    The worker's parent is the fork server, which cannot notice its own parent's death while
    workers live (each forked child keeps the server's liveness pipe open), so watch the owner.
    """
    while _is_alive(owner_pid):
        time.sleep(1.0)
    os._exit(0)


START_TIMEOUT = 120.0  # s a started worker waits for the others (WorkerPoolExecutor.start)


def _init_worker(model: nn.Module, arrays: _ClientArrays, owner_pid: int) -> None:
    """Set up a worker process: one torch thread, the model template and all client data."""
    global _worker_model, _worker_data
    torch.set_num_threads(1)
    _keep_freed_memory()
    threading.Thread(target=_exit_with_owner, args=(owner_pid,), daemon=True).start()
    _worker_model = model
    _worker_data = {
        cid: ClientData(
            torch.from_numpy(x), torch.from_numpy(y), None if ids is None else torch.from_numpy(ids)
        )
        for cid, (x, y, ids) in arrays.items()
    }


def _check_in(folder: str, workers: int, timeout: float) -> int:
    """Report this worker up and wait (at most ``timeout`` s) until ``workers`` have reported.

    While it waits the worker takes no other task, so ``workers`` such tasks land on as many
    workers, each started and initialised (``WorkerPoolExecutor.start``). A file per process
    id in ``folder`` is the barrier: a multiprocessing barrier can reach a pool's workers only
    through their start arguments.
    """
    pid = os.getpid()
    open(os.path.join(folder, str(pid)), "w").close()  # noqa: SIM115 - an empty marker file
    deadline = time.monotonic() + timeout
    while len(os.listdir(folder)) < workers and time.monotonic() < deadline:
        time.sleep(0.01)
    return pid


def _train_client(
    global_params: np.ndarray, client_id: int, seed: int, spec: LocalTrainingSpec
) -> tuple[np.ndarray, int, float]:
    """Run ``local_update`` for one client in a worker; return (delta, num_samples, loss)."""
    if _worker_model is None:
        raise FedUnlearnError("pool worker used before its initialiser ran")
    update = local_update(
        _worker_model,
        torch.from_numpy(global_params),
        _worker_data[client_id],
        spec,
        seed,
        client_id,
    )
    return update.delta.numpy(), update.num_samples, update.train_loss


class WorkerPoolExecutor(CheckedExecutor, Closing):
    """Run clients' ``local_update`` in single-threaded worker processes (see module doc).

    Use it as a context manager, or call ``close()``; workers start on the first ``run``. As with
    any ``spawn`` pool, the model's class must be importable in a fresh interpreter and a script
    that builds the executor must guard its entry point with ``if __name__ == "__main__":``.

    Args:
        model: Template module; it is pickled to each worker once.
        client_data: Every client's training set; pickled to each worker once.
        num_workers: Worker processes; defaults to the number of CPUs this process may use.
        channels_last: Train with 4-D parameters (conv weights) in channels-last memory format.

    Raises:
        ConfigError: if ``num_workers`` < 1 or ``client_data`` is empty.
    """

    name = "pool"

    def __init__(
        self,
        model: nn.Module,
        client_data: Mapping[int, ClientData],
        num_workers: int | None = None,
        channels_last: bool = True,
    ) -> None:
        workers = available_cpus() if num_workers is None else num_workers
        if workers < 1:
            raise ConfigError(f"num_workers must be >= 1; got {workers}")
        if not client_data:
            raise ConfigError("client_data is empty; the pool executor needs at least one client")
        self.model = model
        self.num_workers = workers
        self.channels_last = channels_last
        template = model
        if channels_last and any(p.ndim == 4 for p in model.parameters()):
            # Module.to takes memory_format (torch docs); its stub lists only device/dtype/tensor
            template = copy.deepcopy(model).to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self._num_params = num_params(model)
        self._sizes = {cid: len(data) for cid, data in client_data.items()}
        arrays: _ClientArrays = {
            cid: (
                data.x.detach().cpu().numpy(),
                data.y.detach().cpu().numpy(),
                None if data.ids is None else data.ids.numpy(),
            )
            for cid, data in client_data.items()
        }
        self._pool: _ProcessPool | None = _ProcessPool(
            max_workers=workers,
            mp_context=_start_context(),
            initializer=_init_worker,
            initargs=(template, arrays, os.getpid()),
        )
        self._closed_reason = ""

    def _check_ready(self) -> None:
        self._live_pool()

    def _train(
        self, global_params: torch.Tensor, tasks: Sequence[tuple[int, int]], spec: LocalTrainingSpec
    ) -> list[ClientUpdate]:
        """Train the tasks in the workers (``CheckedExecutor.run`` checked them)."""
        pool = self._live_pool()
        params = global_params.detach().to(torch.float32).cpu().numpy()
        futures = [
            self._submit(pool, _train_client, params, cid, seed, spec) for cid, seed in tasks
        ]
        updates = []
        for (cid, _), future in zip(tasks, futures, strict=True):
            delta, num_samples, loss = self._result(future, f"training client {cid}")
            updates.append(ClientUpdate(cid, torch.from_numpy(delta), num_samples, loss))
        return updates

    def start(self) -> set[int]:
        """Start every worker now rather than on the first ``run``; return their process ids.

        A worker's start (an interpreter from the forkserver, torch, every client's data
        unpickled) is setup, seconds at 1,000 clients: started lazily it was charged to whatever
        trained first (``Federation.start``). One no-op task per worker, submitted before any
        can finish its initializer, starts them all; each waits for the others to report
        (``_check_in``), so every worker is initialised when this returns (or after
        ``START_TIMEOUT`` s, when the machine could not start them all: the rest start on use).

        Raises:
            FedUnlearnError: if the executor is closed or a worker process died.
        """
        pool = self._live_pool()
        with tempfile.TemporaryDirectory(prefix="fedunlearn-pool-") as folder:
            futures = [
                self._submit(pool, _check_in, folder, self.num_workers, START_TIMEOUT)
                for _ in range(self.num_workers)
            ]
            try:
                return {int(future.result()) for future in futures}
            except BrokenProcessPool as exc:
                raise self._crashed("starting a worker") from exc

    def close(self) -> None:
        """Stop the workers (pending tasks are cancelled); calling it again does nothing."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
            self._closed_reason = self._closed_reason or "it was closed"

    def _live_pool(self) -> _ProcessPool:
        if self._pool is None:
            raise FedUnlearnError(
                f"this pool executor cannot run: {self._closed_reason}. Build a new executor."
            )
        return self._pool

    def _submit(self, pool: _ProcessPool, fn: object, *args: object) -> Future[Any]:
        try:
            return pool.submit(fn, *args)  # type: ignore[arg-type]
        except BrokenProcessPool as exc:
            raise self._crashed("submitting work") from exc

    def _result(self, future: Future[Any], doing: str) -> tuple[np.ndarray, int, float]:
        try:
            out: tuple[np.ndarray, int, float] = future.result()
            return out
        except BrokenProcessPool as exc:
            raise self._crashed(doing) from exc

    def _crashed(self, doing: str) -> FedUnlearnError:
        """Close the broken pool and return the error to raise."""
        self._closed_reason = "a worker process died earlier"
        self.close()
        return FedUnlearnError(
            f"a worker process of the pool executor died while {doing} (killed, out of memory, "
            "a crash in native code, or the model could not be unpickled in a fresh process); "
            "the pool is closed. Build a new executor, or run with executor 'serial' to see the "
            "failure in this process."
        )
