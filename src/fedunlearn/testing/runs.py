"""The small finished runs the method contract checks need, trained once per process.

``contract_runs()`` trains them (a backdoored digits federation: 5 clients, an MLP of 16 hidden
units, 5 rounds; a few seconds on 2 cores) into a temporary directory the first time it is
called and returns the same ``ContractRuns`` afterwards; ``train_contract_runs(directory)``
trains them into a directory of your choice (a pytest ``tmp_path_factory`` directory, for a
session-scoped fixture). ``run_dir_digest`` hashes a run directory's content (the checks assert
that a method leaves it untouched).
"""

from __future__ import annotations

import atexit
import copy
import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedunlearn.config import parse_config
from fedunlearn.runs import train_run
from fedunlearn.runs.rundir import DERIVED_CACHE_DIR

__all__ = [
    "ContractRuns",
    "contract_config",
    "contract_runs",
    "run_dir_digest",
    "train_contract_runs",
]

_CONFIG: dict[str, Any] = {
    "seed": 2,
    "data": {"dataset": "digits", "num_clients": 5},
    "model": {"name": "mlp", "hidden": [16]},
    "training": {"rounds": 5, "local_epochs": 2, "lr": 0.3, "batch_size": 32, "executor": "serial"},
    "attack": {"kind": "backdoor", "num_malicious": 1, "trigger_size": 3},
    "history": {"policy": "all"},
}


def contract_config() -> dict[str, Any]:
    """Return (a fresh copy of) the config of the run ``all``: every client update recorded."""
    return copy.deepcopy(_CONFIG)


@dataclass(frozen=True)
class ContractRuns:
    """The finished runs the checks use.

    Attributes:
        all: The ``contract_config()`` run with every client update recorded (policy ``all``).
        none: The same run recording no client update (policy ``none``): a method needing
            client history must refuse it before any work.
    """

    all: Path
    none: Path


_TRAINED: dict[Path, ContractRuns] = {}
_DEFAULT: list[ContractRuns] = []


def train_contract_runs(directory: str | Path) -> ContractRuns:
    """Train the contract runs into ``directory`` (``all/`` and ``none/``), once per process.

    Args:
        directory: A directory without ``all/`` or ``none/`` (created if missing); a second
            call with the same directory returns the runs trained by the first.
    """
    root = Path(directory).resolve()
    if root not in _TRAINED:
        runs = ContractRuns(root / "all", root / "none")
        train_run(parse_config(contract_config()), runs.all)
        train_run(parse_config({**contract_config(), "history": {"policy": "none"}}), runs.none)
        _TRAINED[root] = runs
    return _TRAINED[root]


def contract_runs() -> ContractRuns:
    """Return the contract runs, trained into a temporary directory on the first call.

    The directory is removed when the interpreter exits.
    """
    if not _DEFAULT:
        root = Path(tempfile.mkdtemp(prefix="fedunlearn-contract-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        _DEFAULT.append(train_contract_runs(root))
    return _DEFAULT[0]


def run_dir_digest(run_dir: Path) -> str:
    """Return a hash of a run directory's content.

    Left out: WAL side files that hold no data, and the cache of what methods derive from the
    run alone (``unlearn.derived_cache``: a method may keep its derived selection there, through
    ``context.derived_cache``; it is not the run's content and changes no result).
    """
    h = hashlib.sha256()
    cache = run_dir / DERIVED_CACHE_DIR
    for path in sorted(run_dir.rglob("*")):
        if path.is_relative_to(cache):
            continue
        # a WAL reader creates an empty -wal and a -shm index next to the database: not content
        empty_wal = path.name.endswith("-wal") and path.stat().st_size == 0
        if path.is_file() and not path.name.endswith((".lock", "-shm")) and not empty_wal:
            h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()
