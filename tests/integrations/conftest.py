"""Fixtures of the Flower integration tests: one Flower run at a time across xdist workers.

Every test that starts a Flower runtime (it takes ``flower_lock``) joins the xdist group
``flower``; with ``--dist loadgroup`` (pyproject's ``addopts``) the group runs on one worker, one
test after another, while the other worker goes on with the rest of the suite instead of waiting
on the lock. The lock stays: it also keeps two checkouts' suites on one machine apart.
"""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

LOCK_FILE = Path(tempfile.gettempdir()) / "fedunlearn-flower-tests.lock"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the tests that start a Flower runtime in one xdist group (before xdist reads groups)."""
    for item in items:
        if "flower_lock" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("flower"))


@pytest.fixture
def flower_lock() -> Iterator[None]:
    """Hold a file lock so that pytest-xdist workers never run two Flower/Ray runs at once."""
    with LOCK_FILE.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
