"""Fixtures of the Flower integration tests: one Flower run at a time across xdist workers."""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

LOCK_FILE = Path(tempfile.gettempdir()) / "fedunlearn-flower-tests.lock"


@pytest.fixture
def flower_lock() -> Iterator[None]:
    """Hold a file lock so that pytest-xdist workers never run two Flower/Ray runs at once."""
    with LOCK_FILE.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
