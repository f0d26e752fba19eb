"""How many intra-op threads torch uses: chosen for the CPUs a process gets, then kept per run.

Two facts decide the design (docs/performance.md, "Threads"):

- **The count changes results.** CPU matrix products and convolutions split their reductions by
  thread, so the same float32 computation at 1, 2 or 4 threads differs in the last bits (measured:
  a 512x784 @ 784x128 product and a 5x5 convolution give three different SHA-256 at 1, 2 and 4
  threads on the 2-core CI box). Bit-identity (the replay an auditor runs) therefore holds at one
  thread count. A run records the count it was trained with (store metadata ``torch_threads``)
  and everything that recomputes from it (resume, ``train --continue``, every unlearning session,
  so also a receipt's figures and an auditor's replay) runs at that count, whatever the
  process's default: an auditor's 8-core machine replays a 2-core run's Retrain bit for bit.
- **The default can oversubscribe.** torch starts as many threads as the host has cores; in a
  container limited by a cgroup CPU quota (``cpu.max``) or a CPU affinity mask that is more
  threads than the CPUs the process gets. The CLI reads both and starts with
  ``min(torch's default, available CPUs)`` unless ``--threads`` says otherwise
  (``fedunlearn.cli.threads``); a library user sets ``torch.set_num_threads`` themselves.

A busy machine is not a reason to choose fewer threads automatically: the load changes from
minute to minute and the count must not (it would change the run's results). ``--threads 1``
is the user's choice there (measured in docs/performance.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["run_threads"]


@contextmanager
def run_threads(count: int | None, *, purpose: str = "this step") -> Iterator[None]:
    """Run with the run's own ``count`` intra-op threads, restoring the caller's after.

    ``None`` (a run recorded before the count was stored) keeps the caller's count.
    """
    current = torch.get_num_threads()
    if count is None or int(count) == current:
        yield
        return
    warnings.warn(
        f"this run was trained with {count} torch intra-op threads and this process uses "
        f"{current}; float reductions differ between thread counts, so {purpose} runs with "
        f"{count} to stay bit-identical (start with --threads {count} to silence this)",
        stacklevel=3,
    )
    torch.set_num_threads(int(count))
    try:
        yield
    finally:
        torch.set_num_threads(current)
