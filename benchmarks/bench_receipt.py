"""Benchmark the cost of a receipt (default options) against the cost of Retrain, side by side.

On one trained run (default: the digits quickstart, forgetting honest client 0) it repeats, in
turn: Retrain (``session.run(make_method("retrain"))``), the receipt as ``fedunlearn unlearn``
builds it by default (``Verifier`` with the original-plus-noise control and the client-level
membership test fitted for the request: ``eval.client_membership_check``), and the same receipt
without the client-level test (``--no-client-test``). Each repeat measures the three one after
the other in one process, so the ratios compare like with like on a machine whose speed drifts;
it prints the median wall seconds of each, the median ratio to Retrain, and the client epochs
(exact, load-independent). One torch thread, as the tests use.

    nice -n 5 python benchmarks/bench_receipt.py [--config configs/digits_quickstart.yaml]
        [--forget 0] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from fedunlearn.config import load_config
from fedunlearn.eval import Verifier, client_membership_check
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

REPO = Path(__file__).resolve().parents[1]


def one_repeat(run: Path, request: UnlearnRequest, seed: int) -> dict[str, float]:
    """Time Retrain, the default receipt and the receipt without the client test, in turn."""
    with UnlearnSession(run, evaluate=False) as session:
        started = time.perf_counter()
        retrain = session.run(make_method("retrain"), request)
        retrain_s = time.perf_counter() - started
        candidate = retrain.params  # any model: the receipt's cost does not depend on it

        started = time.perf_counter()
        membership = client_membership_check(session, request, retrain, seed=seed)
        verifier = Verifier(session, request, retrain=retrain, client_membership=membership)
        _, receipt = verifier.audit(candidate, "candidate")
        full_s = time.perf_counter() - started
        check = receipt.check("client_membership")

        started = time.perf_counter()
        verifier = Verifier(session, request, retrain=retrain)
        verifier.audit(candidate, "candidate")
        light_s = time.perf_counter() - started
    return {
        "retrain_s": retrain_s,
        "receipt_s": full_s,
        "receipt_no_client_test_s": light_s,
        "retrain_client_epochs": float(retrain.costs.client_epochs),
        "client_test_client_epochs": float(check.evidence["cost_client_epochs"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs/digits_quickstart.yaml")
    parser.add_argument("--forget", type=int, nargs="+", default=[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    request = UnlearnRequest.of(args.forget, "forget")
    with tempfile.TemporaryDirectory(prefix="bench-receipt-") as tmp:
        run = Path(tmp) / "run"
        train_run(load_config(args.config), run)
        rows = [one_repeat(run, request, args.seed) for _ in range(args.repeats)]
    median = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    ratio = {
        "receipt_over_retrain": statistics.median(r["receipt_s"] / r["retrain_s"] for r in rows),
        "receipt_no_client_test_over_retrain": statistics.median(
            r["receipt_no_client_test_s"] / r["retrain_s"] for r in rows
        ),
    }
    print(
        json.dumps(
            {
                "config": str(args.config),
                "forget": args.forget,
                "repeats": args.repeats,
                "machine": {
                    "cpu": platform.processor() or platform.machine(),
                    "nproc": os.cpu_count(),
                    "load_average": os.getloadavg(),
                },
                "median": median,
                "median_ratio": ratio,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
