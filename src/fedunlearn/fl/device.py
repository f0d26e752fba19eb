"""Where local training and evaluation run: ``training.device`` resolved to a ``torch.device``.

Values: ``auto`` (the first CUDA device if torch sees one, else the CPU; never MPS, whose
kernels differ from the CPU's, so ``auto`` on a machine without CUDA *is* ``cpu``, bit for bit),
``cpu``, ``cuda``, ``cuda:<index>`` and ``mps`` (Apple GPUs, where this torch build has them).
Only client work and evaluation move: the engine keeps the global model, aggregation, the history
store and the 2PC layer on the CPU, and executors return client deltas on the CPU.

Determinism per device (same config and seed):

- ``cpu``: bit-identical from run to run on one machine (every executor; see ``executors``).
- ``cuda``: training and evaluation run under ``cuda_determinism()``: cuDNN picks
  deterministic convolution algorithms and does no autotuning (``cudnn.deterministic = True``,
  ``cudnn.benchmark = False``). The built-in models then use cuBLAS GEMMs, cuDNN convolutions,
  2-d max-pooling, cross-entropy and embeddings; with one CUDA stream and a fixed batch plan
  these are expected to repeat bit for bit on the same GPU model, driver, CUDA, cuDNN and torch
  versions. That expectation is not yet verified on a GPU (none was available when this was
  written); ``tests/fl/test_device.py`` checks run-to-run bit identity wherever one is. Results
  differ from the CPU's at float32 rounding level, more where cuDNN uses TF32 for convolutions
  (PyTorch's default on Ampere and later GPUs; set ``torch.backends.cudnn.allow_tf32 = False``
  for full float32). User models with ops that ``torch.use_deterministic_algorithms`` lists as
  nondeterministic on CUDA (adaptive pooling backward, ``index_add``, ``scatter_add``, ...) are
  not covered.
- ``mps``: no bit-identity claim (Apple's kernels); float64 loss sums are float32 there.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from fedunlearn.errors import ConfigError

__all__ = ["DEVICE_PATTERN", "cuda_determinism", "resolve_device", "sum_dtype"]

#: What ``training.device`` accepts.
DEVICE_PATTERN = r"^(auto|cpu|mps|cuda(:[0-9]+)?)$"


def resolve_device(name: str | torch.device | None = "auto") -> torch.device:
    """Return the ``torch.device`` that ``name`` means on this machine.

    Args:
        name: ``auto``, ``cpu``, ``cuda``, ``cuda:<index>``, ``mps``, a ``torch.device``, or None
            (the same as ``cpu``).

    Raises:
        ConfigError: if ``name`` is not one of these, or names a device this machine or this
            torch build does not have.
    """
    if name is None:
        return torch.device("cpu")
    text = str(name)
    if not re.match(DEVICE_PATTERN, text):
        raise ConfigError(f"unknown device {text!r}; use auto, cpu, cuda, cuda:<index> or mps")
    if text == "auto":
        return (
            torch.device("cuda", torch.cuda.current_device())
            if _has_cuda()
            else torch.device("cpu")
        )
    device = torch.device(text)
    if device.type == "cuda":
        if not _has_cuda():
            raise ConfigError(
                f"device {text!r} is not available: torch {torch.__version__} sees no CUDA GPU "
                f"(torch.cuda.is_available() is False; CUDA build: {torch.version.cuda or 'no'}). "
                "Install a CUDA build of torch (docs/install.md) or set training.device to "
                "'cpu' or 'auto'"
            )
        count = torch.cuda.device_count()
        index = 0 if device.index is None else device.index
        if index >= count:
            raise ConfigError(
                f"device {text!r} is not available: this machine has {count} CUDA device(s) "
                f"(cuda:0..cuda:{count - 1})"
            )
        return torch.device("cuda", index)
    if device.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ConfigError(
                "device 'mps' is not available: it needs an Apple-silicon Mac and a torch build "
                "with MPS (torch.backends.mps.is_available() is False); use 'cpu' or 'auto'"
            )
    return device


def _has_cuda() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def sum_dtype(device: torch.device) -> torch.dtype:
    """Return the dtype of loss accumulators on ``device`` (float64; float32 on MPS)."""
    return torch.float32 if device.type == "mps" else torch.float64


@contextmanager
def cuda_determinism(device: torch.device) -> Iterator[None]:
    """Run the block with cuDNN's deterministic algorithms when ``device`` is a CUDA device.

    Sets ``torch.backends.cudnn.deterministic = True`` and ``benchmark = False`` for the block
    and restores the caller's values afterwards. Does nothing for other devices.
    """
    if device.type != "cuda":
        yield
        return
    cudnn = torch.backends.cudnn
    saved = (cudnn.deterministic, cudnn.benchmark)
    cudnn.deterministic, cudnn.benchmark = True, False
    try:
        yield
    finally:
        cudnn.deterministic, cudnn.benchmark = saved
