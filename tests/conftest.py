"""Shared fixtures: small synthetic federations and the real-MNIST path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedunlearn.fl.records import ClientData

# One intra-op thread per test process: the suite runs under pytest-xdist on 2 cores, and two
# processes with two threads each oversubscribe the CPU (up to 30x slower torch kernels).
torch.set_num_threads(1)

MNIST_PATH = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist.npz"

# Fixtures that start a Flower runtime (tests/integrations/conftest.py): their tests are the
# xdist group "flower", one after another on one worker.
FLOWER_FIXTURES = frozenset({"flower_lock", "example_app_run", "example_app_unlearned"})


def xdist_group_of(item: pytest.Item) -> str | None:
    """Return the xdist group ``item`` joins under ``--dist loadgroup`` (pyproject's addopts).

    ``flower``: it starts a Flower runtime (one at a time). ``module:<path>``: it uses a
    module-scoped fixture; the module's tests run on one worker, which computes the fixture once
    (spread over both workers, each computed it). Otherwise none: the test goes to any worker.
    """
    names = set(getattr(item, "fixturenames", ()))
    if FLOWER_FIXTURES & names:
        return "flower"
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs if info is not None else {}
    shared = [d for name in names for d in defs.get(name, ()) if d.scope in ("module", "package")]
    # autouse ones (one torch thread per module) cost nothing to set up twice (pytest >= 8.1
    # marks them; on another pytest they group their modules too, which is only coarser)
    if any(not getattr(d, "_autouse", False) for d in shared):
        return f"module:{item.nodeid.split('::')[0]}"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give each test its xdist group (before xdist reads groups); the Flower group goes first.

    The Flower group is the suite's longest serial chain: queued first (pyproject's addopts turn
    xdist's reordering off, so its queue follows this order), one worker starts it at once while
    the other works through the rest.
    """
    for item in items:
        group = xdist_group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: xdist_group_of(item) != "flower")


@pytest.fixture
def mnist_path() -> Path:
    if not MNIST_PATH.exists():
        pytest.skip(f"real MNIST not found at {MNIST_PATH}")
    return MNIST_PATH


def make_clients(sizes: list[int], shape=(1, 8, 8), num_classes: int = 10, seed: int = 0):
    """Return {client_id: ClientData} of random images and labels."""
    g = torch.Generator().manual_seed(seed)
    return {
        c: ClientData(
            torch.rand((n, *shape), generator=g), torch.randint(0, num_classes, (n,), generator=g)
        )
        for c, n in enumerate(sizes)
    }
