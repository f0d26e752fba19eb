"""Benchmark the cost of a receipt against the cost of Retrain, request by request.

On one trained run (default: the digits quickstart) it serves ``--requests`` requests of honest
clients in turn (one client each, the honest clients in order, again from the first when there
are fewer clients than requests), each in its own session as ``fedunlearn unlearn`` would: Retrain
(``session.run(make_method("retrain"))``), then the receipt of a model with the receipt options
of the calibration (``ReceiptOptions("retrain")``, Retrain given: it is not the receipt's cost)
and the client-level test's references from ``--references``: ``per_request`` (trained for each
request), ``shared`` (trained once per run generation, read from the run directory by the
later requests: ``eval.mia.shared_references``) or ``held_out`` (none: a null from the run's
test examples, Retrain as anchor: ``eval.mia.heldout``; the default, as the receipt's). The
receipt's own cost is ``Receipts.cost``: every reference it trained (the client test's, the
continued controls) in client epochs (exact, load-independent) and wall seconds. It prints each
request's figures, the first request's and the later ones' apart, and the mean over the requests
against Retrain's. One torch thread.

    nice -n 10 python benchmarks/bench_receipt.py [--config configs/digits_quickstart.yaml]
        [--requests 10] [--references shared|per_request|held_out]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from fedunlearn.config import load_config
from fedunlearn.eval import ReceiptOptions, open_receipts
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

REPO = Path(__file__).resolve().parents[1]


def one_request(run: Path, client: int, options: ReceiptOptions) -> dict[str, float]:
    """Time Retrain and the receipt of one request (its own session)."""
    with UnlearnSession(run, evaluate=False) as session:
        request = UnlearnRequest.of([client])
        started = time.perf_counter()
        retrain = session.run(make_method("retrain"), request)
        retrain_s = time.perf_counter() - started
        started = time.perf_counter()
        receipts = open_receipts(session, request, options, retrain=retrain)
        _, receipt = receipts.audit(retrain.params, "candidate")  # any model: same cost
        receipt_s = time.perf_counter() - started
    cost = receipt.cost or {}
    return {
        "client": client,
        "retrain_s": retrain_s,
        "retrain_client_epochs": float(retrain.costs.client_epochs),
        "receipt_s": receipt_s,
        "receipt_client_epochs": float(cost["client_epochs"]),
        "client_test_client_epochs": float(cost["references"]["client test"]["client_epochs"]),
        "client_membership": receipt.check("client_membership").verdict,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs/digits_quickstart.yaml")
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument(
        "--references",
        choices=("shared", "per_request", "held_out"),
        default=ReceiptOptions().client_test_references,
        help="the client-level test's null (default: the receipt's default, held_out)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    options = ReceiptOptions("retrain", seed=args.seed, client_test_references=args.references)
    with tempfile.TemporaryDirectory(prefix="bench-receipt-") as tmp:
        run = Path(tmp) / "run"
        train_run(load_config(args.config), run)
        with UnlearnSession(run, evaluate=False) as session:
            malicious = session.run_view.malicious
            honest = [c for c in session.run_view.client_ids if c not in malicious]
        clients = [honest[i % len(honest)] for i in range(args.requests)]
        rows = [one_request(run, c, options) for c in clients]
    retrain_epochs = statistics.mean(r["retrain_client_epochs"] for r in rows)
    receipt_epochs = statistics.mean(r["receipt_client_epochs"] for r in rows)
    later = rows[1:] or rows
    print(
        json.dumps(
            {
                "config": str(args.config),
                "references": args.references,
                "requests": args.requests,
                "date": datetime.date.today().isoformat(),
                "machine": {
                    "cpu": platform.processor() or platform.machine(),
                    "nproc": os.cpu_count(),
                    "load_average": os.getloadavg(),
                },
                "rows": rows,
                "mean": {
                    "retrain_client_epochs": retrain_epochs,
                    "receipt_client_epochs": receipt_epochs,
                    "receipt_over_retrain_client_epochs": receipt_epochs / retrain_epochs,
                    "receipt_over_retrain_wall": statistics.mean(r["receipt_s"] for r in rows)
                    / statistics.mean(r["retrain_s"] for r in rows),
                },
                "first_request_over_retrain_client_epochs": rows[0]["receipt_client_epochs"]
                / rows[0]["retrain_client_epochs"],
                "later_requests_over_retrain_client_epochs": statistics.mean(
                    r["receipt_client_epochs"] / r["retrain_client_epochs"] for r in later
                ),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
