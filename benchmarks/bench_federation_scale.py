"""Benchmark the federation at scale: train M clients, then compare Retrain and three methods.

Trains an MNIST run of ``--clients`` clients (default 1,000; Dirichlet alpha 0.5, the MLP
784-128-10 or, with ``--model cnn``, the 582k-parameter CNN, ``--participation`` 0.01 = 10
clients a round, ``--rounds`` rounds of one local epoch,
``history.policy: all``), then runs what ``fedunlearn compare RUN --forget C --methods
fedrecover,federaser,crab --no-client-test`` runs (``compare_methods`` with
``ReceiptOptions(client_test=False)``: receipts without the client-level test) for Retrain,
FedRecover, FedEraser and Crab (Crab derives its selection from the ``all`` history), forgetting
one client that took part in round 1. Each step runs in its own process (``--step``), so
each peak RSS (``resource.getrusage``, the process's high-water mark) is that step's alone:

- ``train``: the run's training and recording (seconds, store MB, peak RSS);
- ``compare``: the four methods in one session with their receipts (``compare_methods``): each
  method's own ``wall_seconds`` (evaluation and receipt excluded), server seconds, client epochs,
  history MB read, and the two ratios the issue's target sets side by side: method wall /
  Retrain wall against method epochs / Retrain epochs, from the same comparison. This is each
  method's first request on the run: Crab derives its selection here;
- ``unlearn-<method>``, after compare: one method alone, as ``fedunlearn unlearn --no-verify``
  runs it (the session opened, the method run, no receipt): its wall time and peak RSS. Crab's
  is a second request on the same history, so it reads the selection compare derived
  (``RUN/derived/``). With ``--skip-unlearn`` only Retrain and Crab run here;
- ``live_crab`` (unless ``--no-live-crab``): a second run, the same but recorded with
  ``history.policy: crab`` (Crab's own setting: Stage I keeps its selection while training, so a
  request reads only the kept rounds and derives nothing), and the ``compare`` of Retrain and
  Crab on it.

Prints one JSON document. The data is read from ``--data-dir`` (a folder with ``mnist.npz``).

    nice -n 10 python benchmarks/bench_federation_scale.py --data-dir DIR [--clients 1000]
        [--rounds 200] [--participation 0.01] [--methods fedrecover,federaser,crab]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MB = 1e6
METHODS = ("fedrecover", "federaser", "crab")
RUN_KEYS = ("data_dir", "clients", "rounds", "participation", "seed", "model", "eval_every")


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB


def run_config(args: argparse.Namespace) -> dict[str, Any]:
    """The benchmark's run configuration (a ``RunConfig`` document)."""
    return {
        "seed": args.seed,
        "data": {
            "dataset": "mnist",
            "data_dir": str(args.data_dir),
            "num_clients": args.clients,
            "partition": "dirichlet",
            "alpha": 0.5,
            "min_client_samples": 10,
        },
        "model": {"name": "mlp", "hidden": [128]} if args.model == "mlp" else {"name": "cnn"},
        "training": {
            "rounds": args.rounds,
            "participation": args.participation,
            "local_epochs": 1,
            "batch_size": 32,
            "lr": 0.05,
            "eval_every": args.eval_every,
        },
        "history": {"policy": args.policy},
    }


def step_train(args: argparse.Namespace) -> dict[str, Any]:
    from fedunlearn.config import RunConfig
    from fedunlearn.history.store import HistoryStore
    from fedunlearn.runs import train_run

    started = time.perf_counter()
    train_run(RunConfig.model_validate(run_config(args)), args.run)
    seconds = time.perf_counter() - started
    with HistoryStore.open(args.run / "history") as store:
        first = [c.client_id for c in store.client_records(1) if c.status == "accepted"]
        payload = store.stored_bytes()
    files = sum(f.stat().st_size for f in args.run.rglob("*") if f.is_file())
    return {
        "train_seconds": seconds,
        "store_payload_mb": payload / MB,
        "run_dir_mb": files / MB,
        "round1_clients": first,
    }


def step_unlearn(args: argparse.Namespace, method: str) -> dict[str, Any]:
    from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

    started = time.perf_counter()
    with UnlearnSession(args.run, evaluate=False) as session:
        opened = time.perf_counter() - started
        result = session.run(make_method(method), UnlearnRequest.of([args.forget]))
    costs = result.costs
    return {
        "session_open_seconds": opened,
        "step_seconds": time.perf_counter() - started,
        "wall_seconds": costs.wall_seconds,
        "client_epochs": costs.client_epochs,
        "history_mb_read": costs.history_bytes_read / MB,
        "selection_cached": getattr(result.details, "selection_cached", None),
    }


def step_compare(args: argparse.Namespace) -> dict[str, Any]:
    from fedunlearn.eval import ReceiptOptions
    from fedunlearn.experiments.compare import compare_methods

    started = time.perf_counter()
    doc = compare_methods(
        args.run,
        [args.forget],
        args.methods.split(","),
        receipt=ReceiptOptions(client_test=False),
        evaluate_rounds=args.eval_every == 1,
    )
    seconds = time.perf_counter() - started
    rows = {r["method"]: r for r in doc["methods"]}
    retrain = rows["retrain"]
    table = {}
    for name, row in rows.items():
        wall, epochs = row["wall_seconds"], row["client_epochs"]
        wall_ratio = wall / retrain["wall_seconds"] if retrain["wall_seconds"] else None
        epoch_ratio = epochs / retrain["client_epochs"] if retrain["client_epochs"] else None
        table[name] = {
            "wall_seconds": wall,
            "server_seconds": row.get("server_seconds"),
            "client_epochs": epochs,
            "history_mb_read": (row.get("history_bytes_read") or 0) / MB,
            "wall_over_retrain": wall_ratio,
            "epochs_over_retrain": epoch_ratio,
            # the target: wall <= epoch ratio x Retrain's wall (+10%)
            "meets_wall_target": (
                None
                if name in ("none", "retrain") or wall_ratio is None or epoch_ratio is None
                else wall_ratio <= epoch_ratio * 1.10
            ),
            "test_accuracy": row.get("test_accuracy"),
            "receipt_seconds": (row.get("verification") or {})
            .get("cost", {})
            .get("judging_seconds"),
        }
    return {"compare_seconds": seconds, "methods": table}


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    if args.step == "train":
        out = step_train(args)
    elif args.step == "compare":
        out = step_compare(args)
    else:
        out = step_unlearn(args, args.step.removeprefix("unlearn-"))
    out["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(out))


def spawn(args: argparse.Namespace, step: str, **extra: Any) -> dict[str, Any]:
    """Run ``step`` in a fresh process and return its JSON line."""
    command = [sys.executable, __file__, "--step", step, "--run", str(args.run)]
    for key in (*RUN_KEYS, "threads", "methods", "policy"):
        command += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    for key, value in extra.items():
        command += [f"--{key}", str(value)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="folder with mnist.npz")
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--participation", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--model", choices=("mlp", "cnn"), default="mlp", help="the MLP 784-128-10 or the 582k CNN"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per step")
    parser.add_argument(
        "--eval-every",
        type=int,
        default=1,
        help="training.eval_every; above 1, compare also skips the per-round test metrics",
    )
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument(
        "--skip-unlearn",
        action="store_true",
        help="per-method processes for Retrain and Crab only (Crab's second request)",
    )
    parser.add_argument(
        "--no-live-crab",
        action="store_true",
        help="skip the second run, recorded with history.policy crab (Crab's own setting)",
    )
    parser.add_argument("--policy", default="all", help=argparse.SUPPRESS)
    parser.add_argument("--step", help=argparse.SUPPRESS)
    parser.add_argument("--run", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--forget", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        child(args)
        return
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        args.run = Path(tmp) / "run"
        train = spawn(args, "train")
        forget = train["round1_clients"][0]
        compare = spawn(args, "compare", forget=forget)
        # after compare: Crab's process then reads the selection compare derived (a second
        # request on the same history, RUN/derived/); Retrain's is its side-by-side reference
        unlearn = {}
        methods = args.methods.split(",")
        wanted = methods if not args.skip_unlearn else [m for m in methods if m == "crab"]
        if wanted:
            for method in ("retrain", *wanted):
                unlearn[method] = spawn(args, f"unlearn-{method}", forget=forget)
        live_crab = None
        if not args.no_live_crab and "crab" in args.methods.split(","):
            # Crab's paper setting: Stage I selects what to keep while training, so a request
            # reads only the kept rounds; on the "all" run above it derives that selection first
            live = argparse.Namespace(**{**vars(args), "policy": "crab", "methods": "crab"})
            live.run = Path(tmp) / "run-crab"
            live_train = spawn(live, "train")
            live_crab = {
                "train": {k: v for k, v in live_train.items() if k != "round1_clients"},
                "compare": spawn(live, "compare", forget=forget),
            }
    print(
        json.dumps(
            {
                "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "command": " ".join(sys.argv),
                "machine": {
                    "cpu": platform.processor() or platform.machine(),
                    "nproc": os.cpu_count(),
                    "load_average": os.getloadavg(),
                },
                "clients": args.clients,
                "model": args.model,
                "rounds": args.rounds,
                "participation": args.participation,
                "eval_every": args.eval_every,
                "forget": forget,
                "train": {k: v for k, v in train.items() if k != "round1_clients"},
                "unlearn": unlearn,
                "compare": compare,
                "live_crab": live_crab,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
