"""Fixtures of the Flower integration tests: one Flower run at a time, shared runs.

Every test that starts a Flower runtime (it takes ``flower_lock``, or a shared run below that
starts one; tests/conftest.py's ``FLOWER_FIXTURES``) joins the xdist group ``flower``; with
``--dist loadgroup`` (pyproject's ``addopts``) the group runs on one worker, one test after
another, while the other worker goes on with the rest of the suite instead of waiting on the
lock. The lock stays: it also keeps two
checkouts' suites on one machine apart.

A Flower run costs seconds of process and Ray start-up and at least 3 s per exchange (Flower's
Grid polls every 3 s), and the group runs serially: ``example_app_run`` trains the example app
under ``flwr run`` once, and every test that only needs such a run reads it (or a copy, if it
changes the run) instead of training its own; ``example_app_unlearned`` likewise runs one
unlearning request on it under ``flwr run`` for the tests that check or continue from that request.
"""

from __future__ import annotations

import fcntl
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

LOCK_FILE = Path(tempfile.gettempdir()) / "fedunlearn-flower-tests.lock"
EXAMPLE_APP = Path(__file__).resolve().parents[2] / "examples" / "flower-app"


@contextmanager
def holding_flower_lock() -> Iterator[None]:
    """Hold a file lock so that pytest-xdist workers never run two Flower/Ray runs at once."""
    with LOCK_FILE.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@pytest.fixture
def flower_lock() -> Iterator[None]:
    """Hold the Flower lock for the test (see ``holding_flower_lock``)."""
    with holding_flower_lock():
        yield


@dataclass(frozen=True)
class ExampleAppRun:
    """The example app's train job under ``flwr run`` and the same config trained in-process."""

    config_path: Path
    flower: Path  # the run directory the Flower run wrote
    inproc: Path  # the same config trained by train_run
    info: dict  # what simulate() returned: status, log
    num_clients: int
    rounds: int


@pytest.fixture(scope="session")
def example_app_run(tmp_path_factory: pytest.TempPathFactory) -> ExampleAppRun:
    """Train the example app (3 clients, 2 rounds) under ``flwr run`` once for the session.

    Read-only for the tests: a test that changes the run works on a ``shutil.copytree`` of it.
    """
    pytest.importorskip("flwr", reason='Flower is not installed; pip install -e ".[flower]"')
    from flower_support import small_config, write_config

    from fedunlearn import train_run
    from fedunlearn.integrations.flower.server_app import FlowerJob
    from fedunlearn.integrations.flower.simulation import simulate

    root = tmp_path_factory.mktemp("example-app-run")
    num_clients, rounds = 3, 2
    config = small_config(num_clients=num_clients, rounds=rounds)
    path = write_config(config, root / "config.yaml")
    train_run(config, root / "inproc")
    with holding_flower_lock():
        info = simulate(
            FlowerJob(mode="train", run_dir=root / "flower", config_path=path),
            num_clients,
            num_cpus=2,
            app_dir=EXAMPLE_APP,
        )
    return ExampleAppRun(path, root / "flower", root / "inproc", info, num_clients, rounds)


@dataclass(frozen=True)
class ExampleAppUnlearned:
    """``example_app_run``'s Flower run after one request under ``flwr run`` (Retrain, client 0)."""

    run: Path  # a copy of ExampleAppRun.flower; the request read it and left its result inside
    result: Path  # the result JSON (``FlowerJob``'s default path); its model and apply file beside
    forget: tuple[int, ...]
    method: str


@pytest.fixture(scope="session")
def example_app_unlearned(
    tmp_path_factory: pytest.TempPathFactory, example_app_run: ExampleAppRun
) -> ExampleAppUnlearned:
    """Forget client 0 with Retrain over ``flwr run`` on a copy of the example app's run, once.

    Read-only for the tests: one that applies or continues the result works on a copy.
    """
    from fedunlearn.integrations.flower.server_app import FlowerJob
    from fedunlearn.integrations.flower.simulation import simulate

    run = tmp_path_factory.mktemp("example-app-unlearned") / "run"
    shutil.copytree(example_app_run.flower, run)
    forget, method = (0,), "retrain"
    with holding_flower_lock():
        simulate(
            FlowerJob("unlearn", run, method=method, forget=forget),
            example_app_run.num_clients,
            num_cpus=2,
            app_dir=EXAMPLE_APP,
        )
    return ExampleAppUnlearned(run, run / f"flower_{method}.json", forget, method)
