"""Fixtures for the evaluation tests: one torch thread per test module.

The models here are tiny; a second OpenMP thread only spins against other work on a shared
machine (a shadow fit went from 1 s to 30 s on a busy 2-core box).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
