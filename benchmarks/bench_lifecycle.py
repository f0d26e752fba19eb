"""Benchmark a second request on a living run against the first, per method, side by side.

On the digits quickstart (default) it trains once, then for each method (FedRecover, Crab,
FedEraser, and FedRecover followed by Crab: the issue's path) on its own copy of the run:
request 1 forgets honest client 0, its result is applied (``fedunlearn.runs.apply_result``:
the method's trajectory becomes the run's history), the run trains ``--continue`` more rounds
without client 0, and request 2 recovers from the attackers (client 0 forgotten again:
cumulative). It prints a table of client epochs (exact, load-independent), rounds and wall
seconds of both requests and Retrain's epochs for each, and writes the figures as JSON with
``--out``. Target (issue 22): request 2 costs at most request 1 in client epochs. One torch
thread, as the tests use.

    nice -n 5 python benchmarks/bench_lifecycle.py [--config configs/digits_quickstart.yaml]
        [--continue 10] [--out lifecycle.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import tempfile
import time
from pathlib import Path

import torch

from fedunlearn.config import load_config
from fedunlearn.experiments import save_for_apply, unlearn_one
from fedunlearn.runs import apply_result, continue_run, run_info, train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

REPO = Path(__file__).resolve().parents[1]
# (request 1's method, request 2's method): each method against itself, and the path
PAIRS = (
    ("fedrecover", "fedrecover"),
    ("crab", "crab"),
    ("federaser", "federaser"),
    ("fedrecover", "crab"),
)


def request(run: Path, forget: list[int], method: str, out: Path) -> dict[str, object]:
    """Run one request with ``method`` (no receipt), write its result; return its costs."""
    started = time.perf_counter()
    result, summary = unlearn_one(run, forget, method, verify=False)
    wall = time.perf_counter() - started
    save_for_apply(out, summary, result)
    out.write_text(json.dumps(summary))
    with UnlearnSession(run, evaluate=False) as session:
        retrain = session.run(make_method("retrain"), UnlearnRequest.of(forget))
    return {
        "forget": summary["request"]["forget"],
        "client_epochs": result.costs.client_epochs,
        "rounds": result.costs.rounds,
        "wall_seconds": wall,
        "test_accuracy": summary["test_accuracy"],
        "trajectory_rounds": summary["apply"]["trajectory_rounds"],
        "retrain_epochs": retrain.costs.client_epochs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "digits_quickstart.yaml"))
    parser.add_argument("--continue", dest="more", type=int, default=10)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        train_run(load_config(args.config), base)
        attackers = run_info(base)["malicious_clients"]
        for one, two in PAIRS:
            label = one if one == two else f"{one} -> {two}"
            run = Path(tmp) / f"{one}-{two}"
            shutil.copytree(base, run)
            first = request(run, [0], one, run.with_suffix(".1.json"))
            apply_result(run, run.with_suffix(".1.json"))
            continue_run(run, args.more)
            second = request(run, attackers, two, run.with_suffix(".2.json"))
            rows[label] = {"request 1": first, "request 2": second}
    print(f"machine: {platform.machine()} {platform.processor()}, torch threads 1")
    print("| method | request 1 epochs (Retrain) | request 2 epochs (Retrain) | 2 / 1 |")
    print("|---|---|---|---|")
    for method, row in rows.items():
        a, b = row["request 1"], row["request 2"]
        print(
            f"| {method} | {a['client_epochs']} ({a['retrain_epochs']}) | "
            f"{b['client_epochs']} ({b['retrain_epochs']}) | "
            f"{b['client_epochs'] / max(a['client_epochs'], 1):.2f} |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
