"""Benchmark ``history.encoding: float16``: store bytes, and each method's error against float32.

Trains the digits quickstart (``configs/digits_quickstart.yaml``: 10 clients, 30 rounds, two
backdoor attackers) twice, once per encoding (the same seed: the same training, bit for bit),
then on each run unlearns one request (``--forget``, default the attackers 1 and 3 as the run
draws them, else the ids given) with Retrain, FedRecover, FedEraser and Crab. Prints one JSON
document with, per encoding, the store's update bytes, and per method:

- ``to_retrain``: the L2 distance of the method's model to the same run's Retrain;
- ``encoding_shift``: the L2 distance between the method's float16 and float32 models, and the
  same relative to ``to_retrain`` (the error float16 storage adds, against the method's own
  distance to Retrain);
- test accuracy and the backdoor's attack success rate of both models;
- ``history_bytes_read`` of both.

    nice -n 10 python benchmarks/bench_history_encoding.py [--forget 1 3] [--seed 0]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import tempfile
from pathlib import Path
from typing import Any

import torch
import yaml

from fedunlearn.config import parse_config
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

REPO = Path(__file__).resolve().parents[1]
METHODS = ("retrain", "fedrecover", "federaser", "crab")
ENCODINGS = ("float32", "float16")


def _train(root: Path, encoding: str, seed: int) -> Path:
    doc = yaml.safe_load((REPO / "configs/digits_quickstart.yaml").read_text())
    doc["seed"] = seed
    doc["history"] = {**doc.get("history", {}), "encoding": encoding}
    run = root / encoding
    train_run(parse_config(doc), run)
    return run


def _unlearn(run: Path, forget: list[int] | None) -> tuple[list[int], dict[str, Any]]:
    out: dict[str, Any] = {}
    with UnlearnSession(run) as session:
        ids = sorted(session.run_view.malicious) if forget is None else forget
        request = UnlearnRequest.of(ids)
        for name in METHODS:
            result = session.run(make_method(name), request)
            metrics = session.evaluation.evaluate(result.params)
            out[name] = {
                "params": result.params,
                "accuracy": metrics.get("test_accuracy"),
                "backdoor_asr": metrics.get("backdoor_asr"),
                "history_bytes_read": result.costs.history_bytes_read,
                "wall_seconds": result.costs.wall_seconds,
            }
    return ids, out


def main() -> None:
    """Run the benchmark and print its JSON document."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forget", type=int, nargs="*", default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    found: dict[str, dict[str, Any]] = {}
    store_bytes: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for encoding in ENCODINGS:
            run = _train(Path(tmp), encoding, args.seed)
            with HistoryStore.open(run / "history") as store:
                store_bytes[encoding] = store.stored_bytes_by_kind().get("update", 0)
            forget, found[encoding] = _unlearn(run, args.forget)
    rows = {}
    for name in METHODS:
        full, half = found["float32"][name], found["float16"][name]
        to_retrain = float((full["params"] - found["float32"]["retrain"]["params"]).norm())
        shift = float((half["params"] - full["params"]).norm())
        rows[name] = {
            "to_retrain": to_retrain,
            "encoding_shift": shift,
            "shift_over_to_retrain": shift / to_retrain if to_retrain else None,
            **{f"{k}_float32": full[k] for k in ("accuracy", "backdoor_asr", "history_bytes_read")},
            **{f"{k}_float16": half[k] for k in ("accuracy", "backdoor_asr", "history_bytes_read")},
        }
    print(
        json.dumps(
            {
                "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
                "torch": torch.__version__,
                "forget": forget,
                "update_bytes": store_bytes,
                "methods": rows,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
