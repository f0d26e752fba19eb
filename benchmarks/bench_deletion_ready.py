"""Deletion-ready training at federation scale: cost per request, accuracy, receipts (issue 32).

Scenarios (each prints its table and writes ``<out>/<scenario>.json``; docs/performance.md quotes
them, with the machine, command and date):

- ``main``: M clients (default 1,000) on real MNIST, Dirichlet alpha = 0.5, K = participation x M
  draws per round (default 0.005 -> 5), ``--rounds`` rounds, TV-stable (E local steps of b) beside
  plain FedAvg with the same participation and rounds. Then ``--requests`` single-client deletion
  requests in sequence (random clients, fixed seed), each served by ``tv_exact``, verified and
  applied before the next; Retrain on the same run state every ``--retrain-every`` requests (its
  cost does not depend on the client: R rounds of the run's draws); the planner's prediction
  beside each measurement; then the same requests on the FedAvg run by Retrain, FedRecover and
  Crab (each from the unapplied run; receipts without the client-level test).
- ``rho``: M = 100, a sweep of K (so rho_C = K R / M): accuracy of TV-stable vs FedAvg and the
  mean cost per request (measured and planned); a plot.
- ``shards``: S = 5 and 10 isolated shards: accuracy of the weight average and of the prediction
  ensemble vs FedAvg, and ``shard_retrain``'s cost per request vs Retrain.
- ``samples``: requests deleting 1% of one client's examples on TV-stable runs (the ``main``
  setting, and one with a smaller rho_S), cost vs Retrain.

Costs are the method's own: client trajectories (participations), client epochs, wall seconds
of the method (``costs.wall_seconds``), measured side by side in one process; Retrain's are
measured on the same run state. Run (about 30-60 minutes on 2 CPU cores for everything):

    python benchmarks/bench_deletion_ready.py --scenario all --out runs/bench_deletion_ready
    python benchmarks/bench_deletion_ready.py --scenario main --model cnn --rounds 100

``--quick`` shrinks every scenario to a smoke test (a few minutes).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedunlearn.config import parse_config
from fedunlearn.eval import ReceiptOptions
from fedunlearn.experiments import save_for_apply, unlearn_one
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import HISTORY_DIR, train_run
from fedunlearn.runs.lifecycle import apply_result
from fedunlearn.runs.plan import PlanInputs, client_request, sample_request
from fedunlearn.runs.setup import build_setup

#: Where mnist.npz is: ``--data-dir``, else the project's shared data beside the repository.
MNIST_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"


DATA_DIR = MNIST_DIR


def config(
    *,
    clients: int,
    rounds: int,
    participation: float,
    model: str,
    sampling: str,
    steps: int,
    batch: int,
    shards: int = 1,
    policy: str = "none",
    seed: int = 0,
    lr: float | None = None,
) -> Any:
    """Return a run config on real MNIST (Dirichlet 0.5, every client >= one mini-batch)."""
    training: dict[str, Any] = {
        "rounds": rounds,
        "participation": participation,
        "batch_size": batch,
        "lr": lr if lr is not None else (0.05 if model == "mlp" else 0.02),
        "shards": shards,
        "executor": "serial" if model == "mlp" else "auto",
    }
    # the same local work for both: E steps of b samples (FedAvg weighs by n_c, draws without
    # replacement; TV-stable weighs by multiplicity, draws with replacement)
    training |= {"local_steps": steps}
    if sampling == "tv_stable":
        training |= {"sampling": "tv_stable"}
    return parse_config(
        {
            "seed": seed,
            "data": {
                "dataset": "mnist",
                "data_dir": str(DATA_DIR),
                "num_clients": clients,
                "partition": "dirichlet",
                "alpha": 0.5,
                "min_client_samples": batch,
                "max_test_samples": 2000,
            },
            "model": {"name": model, **({"hidden": [128]} if model == "mlp" else {})},
            "training": training,
            "history": {"policy": policy},
        }
    )


def train(cfg: Any, path: Path) -> dict[str, Any]:
    """Train ``cfg`` into a fresh ``path``; return its summary with the wall time."""
    shutil.rmtree(path, ignore_errors=True)
    started = time.perf_counter()
    summary = train_run(cfg, path)
    summary["bench_wall_seconds"] = time.perf_counter() - started
    return summary


def plan_inputs(cfg: Any, path: Path) -> PlanInputs:
    """The planner's inputs for the run at ``path`` as it is now (remaining clients' sizes)."""
    with HistoryStore.open(path / HISTORY_DIR) as store:
        gone = store.forgotten_clients()
        sizes = [
            int(n)
            for c, n in sorted(store.meta["client_sizes"].items(), key=lambda kv: int(kv[0]))
            if int(c) not in gone
        ]
        num_params = int(store.meta["num_params"])
    return PlanInputs.from_config(cfg, sizes, num_params)


def serve(path: Path, work: Path, name: str, method: str, **request: Any) -> dict[str, Any]:
    """Unlearn one request with ``method`` (verified, no per-round evaluation); its figures."""
    started = time.perf_counter()
    result, summary = unlearn_one(
        path,
        request.get("forget", []),
        method,
        samples=request.get("samples"),
        receipt=ReceiptOptions(client_test=request.get("client_test", True)),
        evaluate_rounds=False,
    )
    total = time.perf_counter() - started
    out = work / f"{name}.json"
    if request.get("apply"):
        save_for_apply(out, summary, result)
        out.write_text(json.dumps(summary))
        apply_result(path, out)
    verification = summary.get("verification") or {}
    return {
        "method": method,
        "forget": request.get("forget", []),
        "samples": {str(c): len(v) for c, v in (request.get("samples") or {}).items()},
        "participations": result.costs.client_participations,
        "client_epochs": result.costs.client_epochs,
        "rounds": result.costs.rounds,
        "method_wall_seconds": result.costs.wall_seconds,
        "total_wall_seconds": total,
        "history_bytes_read": result.costs.history_bytes_read,
        "test_accuracy": summary.get("test_accuracy"),
        "influence": verification.get("influence"),
        "lineage": (summary.get("lineage") or {}).get("kind"),
        "recomputed_from": (summary.get("details") or {}).get("recomputed_from_round"),
    }


def last_round(path: Path) -> int:
    with HistoryStore.open(path / HISTORY_DIR) as store:
        return int(store.last_round() or 0)


def _pick(clients: int, count: int, seed: int, exclude: set[int] | None = None) -> list[int]:
    rng = np.random.default_rng(seed)
    pool = [c for c in range(clients) if c not in (exclude or set())]
    return [int(c) for c in rng.choice(pool, size=count, replace=False)]


def scenario_main(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    m, rounds = args.clients, args.rounds
    common = {
        "clients": m,
        "rounds": rounds,
        "participation": args.participation,
        "model": args.model,
    }
    tv_cfg = config(**common, sampling="tv_stable", steps=args.steps, batch=args.batch)
    fa_cfg = config(**common, sampling="fraction", steps=args.steps, batch=args.batch, policy="all")
    tv, fa = out / "main_tv", out / "main_fedavg"
    trained = {"tv_stable": train(tv_cfg, tv), "fedavg": train(fa_cfg, fa)}
    accuracy = {k: v["final_metrics"]["test_accuracy"] for k, v in trained.items()}
    print(f"accuracy: tv_stable {accuracy['tv_stable']:.4f}, fedavg {accuracy['fedavg']:.4f}")
    requests = _pick(m, args.requests, seed=7)
    rows, retrains = [], []
    work = out / "main_results"
    work.mkdir(exist_ok=True)
    for i, client in enumerate(requests):
        inputs = plan_inputs(tv_cfg, tv)
        planned = client_request(inputs, 1, after_round=last_round(tv))
        if i % args.retrain_every == 0:
            retrains.append(
                serve(tv, work, f"retrain{i}", "retrain", forget=[client], client_test=False)
            )
        row = serve(tv, work, f"tv{i}", "tv_exact", forget=[client], apply=True)
        row |= {
            "planned_recompute_probability": planned.recompute_probability,
            "planned_rounds": planned.expected_rounds,
            "planned_cost_ratio": planned.cost_ratio,
        }
        rows.append(row)
        print(
            f"request {i + 1:2d}: client {client:4d}: recomputed from "
            f"{row['recomputed_from']}, {row['participations']} trajectories, "
            f"{row['method_wall_seconds']:.2f} s, {row['influence']} ({row['lineage']}); "
            f"planned P={planned.recompute_probability:.3f} E[rounds]={planned.expected_rounds:.1f}"
        )
    retrain_work = statistics.median(r["participations"] for r in retrains)
    retrain_wall = statistics.median(r["method_wall_seconds"] for r in retrains)
    mean_work = statistics.mean(r["participations"] for r in rows)
    mean_wall = statistics.mean(r["method_wall_seconds"] for r in rows)
    baselines = []
    for method in ("retrain", "fedrecover", "crab"):
        for i, client in enumerate(requests[: args.baseline_requests]):
            baselines.append(
                serve(fa, work, f"{method}{i}", method, forget=[client], client_test=False)
            )
    return {
        "accuracy": accuracy,
        "train_wall_seconds": {k: v["bench_wall_seconds"] for k, v in trained.items()},
        "requests": rows,
        "retrain_on_tv_run": retrains,
        "cost_ratio_trajectories": mean_work / retrain_work,
        "cost_ratio_wall": mean_wall / retrain_wall,
        "planned_cost_ratio_mean": statistics.mean(r["planned_cost_ratio"] for r in rows),
        "removed_exact": sum(r["influence"] == "removed" and r["lineage"] == "exact" for r in rows),
        "baselines_on_fedavg_run": baselines,
    }


def scenario_rho(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    m, rounds = args.rho_clients, args.rho_rounds
    points = []
    for k in args.rho_draws:
        participation = k / m
        common = {"clients": m, "rounds": rounds, "participation": participation, "model": "mlp"}
        tv_cfg = config(**common, sampling="tv_stable", steps=args.steps, batch=args.batch)
        fa_cfg = config(**common, sampling="fraction", steps=args.steps, batch=args.batch)
        tv, fa = out / f"rho_tv_{k}", out / f"rho_fa_{k}"
        acc_tv = train(tv_cfg, tv)["final_metrics"]["test_accuracy"]
        acc_fa = train(fa_cfg, fa)["final_metrics"]["test_accuracy"]
        work = out / f"rho_results_{k}"
        work.mkdir(exist_ok=True)
        clients = _pick(m, args.rho_requests, seed=11)
        inputs = plan_inputs(tv_cfg, tv)
        planned = client_request(inputs, 1).cost_ratio
        retrain = serve(tv, work, "retrain", "retrain", forget=[clients[0]], client_test=False)
        served = [
            serve(tv, work, f"tv{i}", "tv_exact", forget=[c], apply=True, client_test=False)
            for i, c in enumerate(clients)
        ]
        ratio = statistics.mean(r["participations"] for r in served) / retrain["participations"]
        point = {
            "draws_per_round": k,
            "rho_clients": k * rounds / m,
            "accuracy_tv_stable": acc_tv,
            "accuracy_fedavg": acc_fa,
            "cost_ratio_measured": ratio,
            "cost_ratio_planned": planned,
        }
        points.append(point)
        print(
            f"K={k:3d} rho_C={point['rho_clients']:.2f}: accuracy tv {acc_tv:.4f} fedavg "
            f"{acc_fa:.4f}; cost per request {ratio:.3f}x Retrain (planned {planned:.3f})"
        )
    _plot_rho(points, out / "rho.png")
    return {"clients": m, "rounds": rounds, "points": points}


def _plot_rho(points: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rho = [p["rho_clients"] for p in points]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    left.plot(rho, [p["cost_ratio_measured"] for p in points], "o-", label="measured")
    left.plot(rho, [p["cost_ratio_planned"] for p in points], "s--", label="planner")
    left.set_xlabel("rho_C = K R / M")
    left.set_ylabel("cost per request / Retrain")
    left.legend()
    right.plot(rho, [100 * p["accuracy_tv_stable"] for p in points], "o-", label="TV-stable")
    right.plot(rho, [100 * p["accuracy_fedavg"] for p in points], "s--", label="FedAvg")
    right.set_xlabel("rho_C = K R / M")
    right.set_ylabel("test accuracy (%)")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def scenario_shards(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    m, rounds = args.rho_clients, args.rho_rounds
    base = {
        "clients": m,
        "rounds": rounds,
        "participation": args.shard_participation,
        "model": "mlp",
    }
    fa_cfg = config(**base, sampling="fraction", steps=args.steps, batch=args.batch)
    accuracy_fedavg = train(fa_cfg, out / "shards_fedavg")["final_metrics"]["test_accuracy"]
    rows = []
    for s in args.shards:
        cfg = config(**base, sampling="fraction", steps=args.steps, batch=args.batch, shards=s)
        path = out / f"shards_{s}"
        final = train(cfg, path)["final_metrics"]
        work = out / f"shards_results_{s}"
        work.mkdir(exist_ok=True)
        clients = _pick(m, args.shard_requests, seed=13)
        planned = client_request(plan_inputs(cfg, path), 1).cost_ratio
        retrain = serve(path, work, "retrain", "retrain", forget=[clients[0]], client_test=False)
        served = [
            serve(path, work, f"sr{i}", "shard_retrain", forget=[c], apply=True, client_test=False)
            for i, c in enumerate(clients)
        ]
        ratio = statistics.mean(r["participations"] for r in served) / retrain["participations"]
        wall = (
            statistics.mean(r["method_wall_seconds"] for r in served)
            / retrain["method_wall_seconds"]
        )
        row = {
            "shards": s,
            "accuracy_weight_average": final["test_accuracy"],
            "accuracy_ensemble": final.get("ensemble_test_accuracy"),
            "accuracy_fedavg": accuracy_fedavg,
            "cost_ratio": ratio,
            "cost_ratio_planned": planned,
            "wall_ratio": wall,
            "target_ratio": 1.2 / s,
            "removed_exact": sum(
                r["influence"] == "removed" and r["lineage"] == "exact" for r in served
            ),
        }
        rows.append(row)
        print(
            f"S={s}: accuracy average {row['accuracy_weight_average']:.4f} ensemble "
            f"{row['accuracy_ensemble']:.4f} (FedAvg {accuracy_fedavg:.4f}); cost per request "
            f"{ratio:.3f}x Retrain (planned {planned:.3f}, target <= {1.2 / s:.3f}), "
            f"wall {wall:.3f}x"
        )
    return {"clients": m, "rounds": rounds, "rows": rows}


def scenario_samples(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    results = []
    for label, steps, batch in (("main", args.steps, args.batch), ("low_rho_s", 2, 5)):
        common = {
            "clients": args.clients,
            "rounds": args.rounds,
            "participation": args.participation,
        }
        cfg = config(**common, model="mlp", sampling="tv_stable", steps=steps, batch=batch)
        path = out / f"samples_{label}"
        accuracy = train(cfg, path)["final_metrics"]["test_accuracy"]
        setup = build_setup(cfg)
        sizes = {c: len(d) for c, d in setup.federation.client_data.items()}
        setup.close()
        work = out / f"samples_results_{label}"
        work.mkdir(exist_ok=True)
        rng = np.random.default_rng(17)
        owners = [int(c) for c in rng.choice(sorted(sizes), size=args.requests, replace=False)]
        retrain = serve(path, work, "retrain", "retrain", forget=[owners[0]], client_test=False)
        rows = []
        for i, client in enumerate(owners):
            count = max(1, round(0.01 * sizes[client]))
            ids = sorted(int(x) for x in rng.choice(sizes[client], size=count, replace=False))
            inputs = plan_inputs(cfg, path)
            planned = sample_request(inputs, client=client, samples=count).cost_ratio
            row = serve(path, work, f"s{i}", "tv_exact", samples={client: ids}, apply=True)
            row["planned_cost_ratio"] = planned
            rows.append(row)
        ratio = statistics.mean(r["participations"] for r in rows) / retrain["participations"]
        results.append(
            {
                "setting": label,
                "local_steps": steps,
                "batch_size": batch,
                "accuracy": accuracy,
                "cost_ratio": ratio,
                "planned_cost_ratio": statistics.mean(r["planned_cost_ratio"] for r in rows),
                "removed_exact": sum(r["influence"] == "removed" for r in rows),
                "requests": rows,
            }
        )
        planned = results[-1]["planned_cost_ratio"]
        print(
            f"samples ({label}: E={steps}, b={batch}): accuracy {accuracy:.4f}; 1% of one "
            f"client per request: {ratio:.3f}x Retrain (planned {planned:.3f})"
        )
    return {"settings": results}


SCENARIOS = {
    "main": scenario_main,
    "rho": scenario_rho,
    "shards": scenario_shards,
    "samples": scenario_samples,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_deletion_ready"))
    parser.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--participation", type=float, default=0.005)
    parser.add_argument("--steps", type=int, default=10, help="E, local steps (FATS: 10)")
    parser.add_argument("--batch", type=int, default=10, help="b, mini-batch (FATS: 10)")
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--retrain-every", type=int, default=5)
    parser.add_argument("--baseline-requests", type=int, default=5)
    parser.add_argument("--rho-clients", type=int, default=100)
    parser.add_argument("--rho-rounds", type=int, default=50)
    parser.add_argument("--rho-draws", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--rho-requests", type=int, default=10)
    parser.add_argument("--shards", type=int, nargs="+", default=[5, 10])
    parser.add_argument("--shard-participation", type=float, default=0.2)
    parser.add_argument("--shard-requests", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="a smoke test in a few minutes")
    parser.add_argument("--data-dir", type=Path, default=MNIST_DIR, help="folder of mnist.npz")
    args = parser.parse_args()
    global DATA_DIR
    DATA_DIR = args.data_dir
    if args.quick:
        args.clients, args.rounds, args.requests = 60, 10, 3
        args.participation, args.retrain_every, args.baseline_requests = 0.05, 2, 1
        args.rho_clients, args.rho_rounds, args.rho_draws, args.rho_requests = 30, 8, [1, 3], 2
        args.shards, args.shard_requests = [3], 2
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    wanted = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    machine = f"{platform.machine()} {platform.processor() or ''}, torch {torch.__version__}"
    for name in wanted:
        started = time.perf_counter()
        result = SCENARIOS[name](args, args.out)
        result["machine"] = machine
        result["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        result["seconds"] = time.perf_counter() - started
        result["args"] = {k: str(v) for k, v in vars(args).items()}
        (args.out / f"{name}.json").write_text(json.dumps(result, indent=2, default=float) + "\n")
        print(f"[{name}] {result['seconds']:.0f} s -> {args.out / (name + '.json')}")


if __name__ == "__main__":
    main()
