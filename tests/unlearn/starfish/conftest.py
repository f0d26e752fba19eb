"""Fixtures of the Starfish tests: one torch thread, the shared convex run opened once."""

from __future__ import annotations

import pytest
import torch

from fedunlearn.unlearn import UnlearnSession


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="package")
def session(convex_run):
    """The shared convex run (tests/unlearn/conftest.py), opened for unlearning."""
    with UnlearnSession(convex_run, evaluate=False) as opened:
        yield opened
