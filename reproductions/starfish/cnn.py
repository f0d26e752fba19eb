"""Starfish on the paper's MNIST CNN (m = 582,026): plaintext vs 2PC on one small run (SFV2).

Trains one federated run (``model.name: cnn`` on real MNIST; 10 IID clients with 300 training
images each; T = 10 rounds, 1 local epoch, SGD lr 0.05, batch 64, FedAvg; one client backdoored
(trigger patch relabelled to class 0; client 1 with seed 0); history policy ``all``), then
removes that client with Retrain, no unlearning, Starfish ``backend: plain`` and Starfish
``backend: mpc`` (two servers in threads, f = 16, same parameters otherwise). Reports whether
plaintext and 2PC select the same rounds in the same order and raise the same correction
flags, the relative model difference ||M_2pc - M_plain|| / ||M_plain||, test error (TER),
backdoor ASR (on the target's clean training data with the trigger, and on triggered
non-target test inputs), distance to Retrain and wall time of each method. The shadow-model
MIA of ``report.compare.Judge`` is left out: it would train four CNNs. Results: JSON under
``--out``; Markdown on stdout and in ``--doc``.

    nice -n 10 python reproductions/starfish/cnn.py --mnist /work/shared/data/mnist.npz

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Sec. VI. Check SFV2 (plaintext vs 2PC): docs/methods/starfish.md.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from fedunlearn.config import parse_config
from fedunlearn.eval.backdoor import client_backdoor_success_rate
from fedunlearn.eval.distance import l2_distance
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnResult, UnlearnSession, make_method

METHODS: list[tuple[str, str, dict[str, Any]]] = [
    ("Retrain", "retrain", {}),
    ("No unlearning", "none", {}),
    ("Starfish (plaintext)", "starfish", {"backend": "plain"}),
    ("Starfish (2PC)", "starfish", {"backend": "mpc"}),
]


def config(args: argparse.Namespace) -> Any:
    """The run: MNIST CNN, 10 IID clients x 300 images, T = 10, one client backdoored."""
    return parse_config(
        {
            "seed": args.seed,
            "data": {
                "dataset": "mnist",
                "data_dir": str(args.mnist.resolve().parent),
                "num_clients": 10,
                "partition": "iid",
                "max_train_samples": 3_000,
            },
            "model": {"name": "cnn"},
            "training": {"rounds": args.rounds, "local_epochs": 1, "lr": 0.05, "batch_size": 64},
            "attack": {"kind": "backdoor", "num_malicious": 1, "target_label": 0},
            "history": {"policy": "all"},
        },
        "starfish_cnn",
    )


def pct(x: float | None) -> str:
    """Format a rate as a percentage."""
    return "-" if x is None else f"{100 * x:.1f}"


def judge(session: UnlearnSession, result: UnlearnResult, forget: list[int]) -> dict[str, Any]:
    """TER, backdoor ASR (test set and target's own data) and costs of one result."""
    evaluation = session.evaluation
    quality = evaluation.evaluate(result.params)
    clean = [evaluation.clean_data(c) for c in forget]
    return {
        "test_error": 1 - quality["test_accuracy"],
        "backdoor_asr": quality.get("backdoor_asr"),
        "backdoor_asr_forgotten": client_backdoor_success_rate(
            evaluation.model, result.params, clean, evaluation.trigger, evaluation.target_label
        ),
        "client_epochs": result.costs.client_epochs,
    }


def main() -> None:
    """Train (or reuse) the run, unlearn with the four methods, print and write the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mnist", type=Path, default=Path("/work/shared/data/mnist.npz"))
    parser.add_argument("--out", type=Path, default=Path("runs/starfish_cnn"))
    parser.add_argument("--doc", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    started_at = datetime.now(UTC)
    load_start = os.getloadavg()
    run_dir = args.out / f"seed{args.seed}" / "run"
    t0 = time.perf_counter()
    if not (run_dir / "summary.json").exists():
        summary = train_run(config(args), run_dir)
    else:
        summary = json.loads((run_dir / "summary.json").read_text())
    train_seconds = time.perf_counter() - t0
    print(f"trained in {train_seconds:.1f} s", flush=True)
    forget = list(summary["malicious_clients"])
    request = UnlearnRequest.of(forget)
    rows: list[dict[str, Any]] = []
    results: dict[str, UnlearnResult] = {}
    with UnlearnSession(run_dir) as session:
        num_params = int(session.run_view.initial_params.numel())
        for label, name, params in METHODS:
            started = time.perf_counter()
            result = session.run(make_method(name, params), request)
            seconds = time.perf_counter() - started
            row = judge(session, result, forget)
            row.update(label=label, seconds=seconds)
            if name == "starfish":
                row["selected_rounds"] = result.details.selected_rounds
                row["selection_ranking"] = result.details.selection_ranking
                row["flags"] = {str(k): v for k, v in result.details.flags.items()}
                row["mpc_costs"] = result.details.mpc_costs
            results[label] = result
            rows.append(row)
            print(f"{label}: TER {pct(row['test_error'])}, {seconds:.1f} s", flush=True)
    retrain = results["Retrain"].params
    for row in rows:
        row["distance_to_retrain"] = l2_distance(results[row["label"]].params, retrain)
    plain, secure = results["Starfish (plaintext)"], results["Starfish (2PC)"]
    v2 = {
        "same_selected_rounds": plain.details.selection_ranking
        == secure.details.selection_ranking,
        "selection_ranking_plain": plain.details.selection_ranking,
        "selection_ranking_2pc": secure.details.selection_ranking,
        "same_flags": plain.details.flags == secure.details.flags,
        "relative_model_difference": float(
            (secure.params - plain.params).norm() / plain.params.norm()
        ),
    }
    doc = {
        "summary": summary,
        "num_params": num_params,
        "train_seconds": train_seconds,
        "started_at": started_at.isoformat(timespec="seconds"),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_start": load_start,
        "load_end": os.getloadavg(),
        "v2": v2,
        "methods": rows,
    }
    (args.out / f"seed{args.seed}" / "starfish_cnn.json").write_text(
        json.dumps(doc, indent=2, default=str)
    )
    lines = table(doc)
    print("\n".join(lines))
    if args.doc is not None:
        args.doc.write_text("\n".join(lines) + "\n")


def table(doc: dict[str, Any]) -> list[str]:
    """Markdown table of the four methods and the SFV2 line."""
    lines = [
        "| method | TER % | backdoor ASR (target) % | backdoor ASR (test) % | "
        "dist. to Retrain | client epochs | wall s |",
        "|" + "---|" * 7,
    ]
    for r in doc["methods"]:
        lines.append(
            f"| {r['label']} | {pct(r['test_error'])} | {pct(r['backdoor_asr_forgotten'])} | "
            f"{pct(r['backdoor_asr'])} | {r['distance_to_retrain']:.3f} | "
            f"{r['client_epochs']} | {r['seconds']:.1f} |"
        )
    v2 = doc["v2"]
    lo, hi = doc["load_start"], doc["load_end"]
    lines += [
        "",
        f"m = {doc['num_params']:,}; training {doc['train_seconds']:.1f} s; "
        f"{doc['started_at']} -> {doc['finished_at']}; load average "
        f"{lo[0]:.2f} / {lo[1]:.2f} / {lo[2]:.2f} at start, "
        f"{hi[0]:.2f} / {hi[1]:.2f} / {hi[2]:.2f} at end",
        f"SFV2 (plaintext vs 2PC): same selected rounds {v2['same_selected_rounds']} "
        f"(plain {v2['selection_ranking_plain']}, 2PC {v2['selection_ranking_2pc']}), "
        f"same flags {v2['same_flags']}, relative model difference "
        f"{v2['relative_model_difference']:.2e}",
    ]
    return lines


if __name__ == "__main__":
    main()
