"""``fedunlearn --threads N``: the intra-op thread count a command starts with, and why.

Without ``--threads`` the CLI keeps torch's default (as many threads as the host has cores)
unless the process gets fewer CPUs than that: a CPU affinity mask or a cgroup quota
(``cpu.max``, as containers set it) caps it at the CPUs available, since more threads than CPUs
only wait for each other. The load of a busy machine does not change the count: it varies
from minute to minute and the count must not (float results depend on it; a run keeps the count
it was trained with, ``fedunlearn.fl.threads``). ``--threads 1`` is the user's choice on a busy
machine (measured in docs/performance.md, "Threads").

Torch is imported only when the count must change, so cheap commands stay quick.
"""

from __future__ import annotations

import math
import os
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import typer

from fedunlearn.errors import ConfigError

__all__ = [
    "MAX_THREADS",
    "ThreadChoice",
    "apply_threads",
    "available_cpus",
    "cgroup_cpu_limit",
    "choose_threads",
    "threads_line",
]

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2
CGROUP_V1_QUOTA = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
CGROUP_V1_PERIOD = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
MAX_THREADS = 1024


def cgroup_cpu_limit(
    cpu_max: Path = CGROUP_CPU_MAX,
    v1_quota: Path = CGROUP_V1_QUOTA,
    v1_period: Path = CGROUP_V1_PERIOD,
) -> int | None:
    """CPUs a cgroup quota allows (rounded up), or None when there is no quota."""
    try:
        quota, period = cpu_max.read_text().split()[:2]
        return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    try:
        quota_us = int(v1_quota.read_text())
        period_us = int(v1_period.read_text())
    except (OSError, ValueError):
        return None
    if quota_us <= 0 or period_us <= 0:  # -1: no quota
        return None
    return max(1, math.ceil(quota_us / period_us))


def available_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup quota."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        count = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    return max(1, count if limit is None else min(count, limit))


@dataclass(frozen=True)
class ThreadChoice:
    """The count a command starts with, and why."""

    threads: int
    reason: str


def choose_threads(requested: int | None, torch_default: int, cpus: int) -> ThreadChoice:
    """``requested``, else torch's default capped at the available CPUs.

    Raises:
        ConfigError: ``requested`` is not between 1 and ``MAX_THREADS``.
    """
    if requested is not None:
        if not 1 <= requested <= MAX_THREADS:
            raise ConfigError(f"--threads must be between 1 and {MAX_THREADS}, got {requested}")
        return ThreadChoice(requested, f"--threads; {cpus} CPU(s) available to this process")
    if torch_default > cpus:
        return ThreadChoice(
            cpus, f"torch's default {torch_default} capped at the {cpus} CPU(s) available"
        )
    return ThreadChoice(torch_default, f"torch's default; {cpus} CPU(s) available")


_CHOICE: ContextVar[ThreadChoice | None] = ContextVar("fedunlearn_threads", default=None)


def apply_threads(ctx: typer.Context, requested: int | None) -> None:
    """Set the command's thread count (the root callback calls it); undone when ``ctx`` closes."""
    cpus = available_cpus()
    if requested is None and cpus >= (os.cpu_count() or 1):
        return  # torch's default cannot exceed the CPUs: nothing to change, torch not loaded
    import torch

    before = torch.get_num_threads()
    choice = choose_threads(requested, before, cpus)
    torch.set_num_threads(choice.threads)
    token = _CHOICE.set(choice)
    ctx.call_on_close(partial(_restore, before, token))


def _restore(before: int, token: object) -> None:
    import torch

    torch.set_num_threads(before)
    _CHOICE.reset(token)  # type: ignore[arg-type]


def threads_line(run_threads: int | None = None) -> str:
    """One line for a command's output: the count it computes with, and why.

    Args:
        run_threads: The count the run was trained with (store metadata ``torch_threads``),
            which every step on the run uses; None for a new run.
    """
    import torch

    choice = _CHOICE.get()
    if choice is None:
        choice = choose_threads(None, torch.get_num_threads(), available_cpus())
    if run_threads is None or int(run_threads) == choice.threads:
        return f"torch threads: {choice.threads} ({choice.reason})"
    return (
        f"torch threads: {int(run_threads)} (the run's own, for bit-identical results; this "
        f"process would use {choice.threads}: {choice.reason})"
    )
