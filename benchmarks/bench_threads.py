"""Benchmark torch's thread count on a quiet and on a busy machine (issue 35, item 4).

Trains the same run (``fedunlearn --threads T train``, a fresh process each time) with T = 1
and T = the CPUs available, on a quiet machine and with ``--busy`` other CPU-bound processes
running (pure Python loops, one per process), interleaved ``--repeats`` times; prints the median
wall time of each cell and each count's ratio to the quiet default. Also prints whether the
final models at the two counts are bit-identical (they are not for models with products large
enough to be split across threads: the count is part of a run's determinism, fl/threads.py).

    python benchmarks/bench_threads.py --data-dir ../shared/data --repeats 3 --busy 2

The run: MNIST MLP 784-128-10, 20 IID clients, 5 rounds x 1 epoch, history off (as
``configs/mnist_mlp_fast.yaml`` but shorter); without ``--data-dir`` the digits MLP.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml


def config(data_dir: str | None) -> dict:
    data = (
        {"dataset": "mnist", "num_clients": 20, "partition": "iid", "data_dir": data_dir}
        if data_dir
        else {"dataset": "digits", "num_clients": 20, "partition": "iid"}
    )
    return {
        "seed": 0,
        "data": data,
        "model": {"name": "mlp", "hidden": [128]},
        "training": {"rounds": 5, "local_epochs": 1, "lr": 0.05, "batch_size": 64},
        "history": {"policy": "none"},
    }


def _burn(stop_at: float) -> None:
    while time.time() < stop_at:
        sum(range(10_000))


def train(cfg: Path, out: Path, threads: int) -> tuple[float, str]:
    cmd = [sys.executable, "-m", "fedunlearn.cli.main", "--threads", str(threads), "train"]
    started = time.perf_counter()
    subprocess.run([*cmd, str(cfg), "--out", str(out), "--json"], check=True, capture_output=True)
    seconds = time.perf_counter() - started
    from fedunlearn.history.store import HistoryStore

    with HistoryStore.open(out / "history") as store:
        model = store.read_model(store.last_round())
    return seconds, hashlib.sha256(model.numpy().tobytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--busy", type=int, default=2, help="CPU-bound processes for 'busy'")
    args = parser.parse_args()
    cpus = len(os.sched_getaffinity(0))
    counts = sorted({1, cpus})
    times: dict[tuple[str, int], list[float]] = {}
    hashes: dict[int, set[str]] = {t: set() for t in counts}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "run.yaml"
        cfg.write_text(yaml.safe_dump(config(args.data_dir)))
        for rep in range(args.repeats):
            for load in ("quiet", "busy"):
                burners = []
                if load == "busy":
                    stop_at = time.time() + 3600
                    burners = [
                        multiprocessing.Process(target=_burn, args=(stop_at,), daemon=True)
                        for _ in range(args.busy)
                    ]
                    for p in burners:
                        p.start()
                try:
                    for t in counts:
                        out = Path(tmp) / f"run-{rep}-{load}-{t}"
                        seconds, digest = train(cfg, out, t)
                        times.setdefault((load, t), []).append(seconds)
                        hashes[t].add(digest)
                finally:
                    for p in burners:
                        p.terminate()
                        p.join()
    base = statistics.median(times[("quiet", cpus)])
    rows = [
        {
            "load": load,
            "threads": t,
            "median_s": round(statistics.median(v), 2),
            "vs_quiet_default": round(statistics.median(v) / base, 2),
            "runs": [round(x, 2) for x in v],
        }
        for (load, t), v in sorted(times.items())
    ]
    print(
        json.dumps(
            {
                "machine": f"{platform.machine()}, {cpus} CPU(s) available",
                "busy_processes": args.busy,
                "dataset": config(args.data_dir)["data"]["dataset"],
                "rows": rows,
                "same_model_at_every_count": len(set().union(*hashes.values())) == 1,
                "repeatable_per_count": all(len(h) == 1 for h in hashes.values()),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
