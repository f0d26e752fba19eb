"""Helpers of the Flower tests: small run configs, history comparison (float tolerance)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import torch

from fedunlearn import parse_config
from fedunlearn.config import RunConfig, dump_config
from fedunlearn.history import HistoryStore

ATOL = 1e-6


def small_config(num_clients: int = 3, rounds: int = 3, **training: object) -> RunConfig:
    """Return a digits / small-MLP run config that trains in well under a second."""
    return parse_config(
        {
            "seed": 7,
            "data": {"dataset": "digits", "num_clients": num_clients},
            "model": {"name": "mlp", "hidden": [16]},
            "training": {
                "rounds": rounds,
                "local_epochs": 1,
                "batch_size": 32,
                "lr": 0.1,
                "executor": "serial",
                **training,
            },
            "history": {"policy": "all"},
        }
    )


def write_config(config: RunConfig, path: Path) -> Path:
    """Write ``config`` as YAML to ``path`` and return it."""
    path.write_text(dump_config(config))
    return path


def assert_same_history(expected_dir: Path, actual_dir: Path, rounds: int) -> None:
    """Assert both runs stored the same models, aggregates, updates, client records, metrics."""
    with (
        HistoryStore.open(expected_dir / "history") as want,
        HistoryStore.open(actual_dir / "history") as got,
    ):
        assert got.rounds() == want.rounds() == list(range(rounds + 1))
        assert got.meta["client_sizes"] == want.meta["client_sizes"]
        assert got.meta["history_policy"] == want.meta["history_policy"]
        for r in range(rounds + 1):
            torch.testing.assert_close(got.read_model(r), want.read_model(r), atol=ATOL, rtol=0)
            if r == 0:
                continue
            torch.testing.assert_close(
                got.read_model(r, "aggregate"), want.read_model(r, "aggregate"), atol=ATOL, rtol=0
            )
            want_updates = dict(want.iter_updates(r))
            got_updates = dict(got.iter_updates(r))
            assert sorted(got_updates) == sorted(want_updates)
            for cid, delta in want_updates.items():
                torch.testing.assert_close(got_updates[cid], delta, atol=ATOL, rtol=0)
            strip = [(c.client_id, c.status, c.num_samples) for c in want.client_records(r)]
            assert [(c.client_id, c.status, c.num_samples) for c in got.client_records(r)] == strip
            for key, value in want.round_scalars(r).items():
                assert abs(float(got.round_scalars(r)[key]) - float(value)) < 1e-4, key


def flower_environment(tmp_path: Path) -> tuple[dict[str, str], int]:
    """Return an environment for ``flwr`` commands on a SuperLink of the test's own, and its port.

    Offline (no telemetry, no dependency installation), ``FLWR_HOME`` in ``tmp_path`` with a
    default connection ``local`` to ``127.0.0.1:<port>``, this Python's scripts first on
    ``PATH``, and the fedunlearn under test first on ``PYTHONPATH`` (Flower's processes import
    it wherever it is).
    """
    import fedunlearn
    from fedunlearn.integrations.flower.simulation import free_port, offline_environment

    env = offline_environment()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    source = str(Path(fedunlearn.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH")) if p)
    home = Path(tempfile.mkdtemp(prefix="flwr-home-", dir=tmp_path))
    env["FLWR_HOME"] = str(home)
    port = free_port()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "local"\n\n[superlink.local]\n'
        f'address = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    return env, port
