"""A run directory's files and what can be read back from them.

A run directory holds ``config.yaml`` (the resolved config), ``history/`` (the store: M_0, every
round's global model and aggregate, the client updates the policy keeps, every client's outcome
and the round metrics), ``metrics.jsonl`` (one line per round, regenerated from the store on
resume), ``summary.json`` (written when training finishes) and, with DP, ``privacy.json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fedunlearn.config import RunConfig, load_config
from fedunlearn.errors import HistoryError
from fedunlearn.fl.records import RoundRecord
from fedunlearn.history.store import HistoryStore
from fedunlearn.privacy.ledger import privacy_summary

__all__ = [
    "CONFIG_FILE",
    "HISTORY_DIR",
    "METRICS_FILE",
    "PRIVACY_FILE",
    "SUMMARY_FILE",
    "MetricsWriter",
    "load_run_config",
    "metrics_line",
    "run_info",
    "run_privacy",
    "write_json",
]

HISTORY_DIR = "history"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
PRIVACY_FILE = "privacy.json"
CONFIG_FILE = "config.yaml"


def run_privacy(config: RunConfig, store: HistoryStore) -> dict[str, Any]:
    """Return the run's privacy ledger summary from its stored round scalars."""
    last = store.last_round() or 0
    scalars = [store.round_scalars(r) for r in range(1, last + 1)]
    return privacy_summary(config.privacy, scalars, store.meta.get("num_params"))


class MetricsWriter:
    """Round observer appending one JSON line of metrics per round."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_round_end(self, record: RoundRecord) -> None:
        """Append the round's metrics."""
        with self.path.open("a") as fh:
            fh.write(json.dumps(metrics_line(record.round, record.metrics, record)) + "\n")


def metrics_line(round_: int, metrics: dict[str, Any], record: RoundRecord | None = None) -> dict:
    """Return the JSON-lines row of a round."""
    row: dict[str, Any] = {"round": round_, **metrics}
    if record is not None:
        row["num_accepted"] = len(record.updates)
        row["num_rejected"] = len(record.rejected)
    return row


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON atomically (temporary file, then rename)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def load_run_config(run_dir: str | Path) -> RunConfig:
    """Return the config a run directory was trained with."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.exists():
        raise HistoryError(f"{run_dir} is not a run directory (no {CONFIG_FILE})")
    return load_config(path)


def run_info(run_dir: str | Path) -> dict[str, Any]:
    """Describe a run: config, rounds, stored bytes (total, per kind, per client), metrics."""
    run_dir = Path(run_dir)
    config = load_run_config(run_dir)
    with HistoryStore.open(run_dir / HISTORY_DIR) as store:
        rounds = store.rounds()
        last = rounds[-1] if rounds else None
        info: dict[str, Any] = {
            "run_dir": str(run_dir),
            "dataset": config.data.dataset,
            "model": config.model.name,
            "num_params": store.meta.get("num_params"),
            "num_clients": config.data.num_clients,
            "rounds_planned": config.training.rounds,
            "rounds_completed": last or 0,
            "complete": last == config.training.rounds,
            "history_policy": config.history.policy,
            "attack": config.attack.kind,
            "malicious_clients": store.meta.get("malicious", []),
            "stored_bytes": store.stored_bytes(),
            "stored_bytes_by_kind": store.stored_bytes_by_kind(),
            "stored_bytes_by_client": {
                str(k): v for k, v in sorted(store.stored_bytes_by_client().items())
            },
            "file_bytes": store.file_bytes(),
            "metrics": [metrics_line(r, store.round_scalars(r)) for r in rounds],
            "privacy": run_privacy(config, store),
        }
    return info
