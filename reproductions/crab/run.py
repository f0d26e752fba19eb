r"""Crab on real MNIST with the paper's CNN: the default rollback next to the paper's (Eqs. 4-6).

One command per configuration (a setting and a seed) trains the poisoned run (every update
recorded, policy ``all``; Crab derives its selection from it, identical to the live ``crab``
policy) and recovers with Retrain, no recovery, and four Crab variants:

- ``crab``: the defaults (``rollback: participation``, ``final_rounds: auto`` within 0.6x
  Retrain's client epochs);
- ``crab (no final tuning)``: the default rollback, ``final_rounds: 0``;
- ``crab bounded``: ``rollback: bounded`` (heuristic), final tuning auto;
- ``crab paper``: ``rollback: paper, rule: literal, final_rounds: 0``: Alg. 2 and Eqs. 3-10 as
  printed.

Each configuration writes ``OUT/seed<s>/<setting>/crab.json``; ``--summarize`` prints the tables
of docs/methods/crab.md and reproductions/crab/README.md from every JSON under ``OUT``.

    flock /tmp/fedunlearn-heavy.lock nice -n 5 python reproductions/crab/run.py \
        --mnist /work/shared/data/mnist.npz --out /work/runs/crab13 --setting backdoor10 --seed 0
    python reproductions/crab/run.py --out /work/runs/crab13 --summarize

Setting (reduced from the paper's for a 2-core CPU, see the README): real MNIST, 20 IID
clients x 1,000 training images (20k, seeded), the full 10k test set; the paper's CNN (582,026
parameters); E = 1 local epoch (paper: 5), T = 20 rounds (paper: 40), SGD lr 0.1 (paper: 0.005),
batch 64, FedAvg; R = 1,000 clean training images; α = 0.1, λ = 0.6, δ = 0.7, β = 0.3.

Paper: Jiang, Shen, Liu, Tan, Lam, "Towards Efficient and Certified Recovery from Poisoning
Attacks in Federated Learning", arXiv:2401.08216v2, Sec. V (MNIST, backdoor at 10% and 50%,
trim attack).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from fedunlearn.config import parse_config
from fedunlearn.fl.metrics import predict_logits
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

SETTINGS: dict[str, dict[str, Any]] = {
    "backdoor10": {"attack": {"kind": "backdoor", "num_malicious": 2}},
    "backdoor50": {"attack": {"kind": "backdoor", "num_malicious": 10}},
    "trim25": {"attack": {"kind": "trim_random", "num_malicious": 5}},
    # rollback that saves work: the 5 attackers join at round 11, half the clients per round
    "late25": {
        "attack": {"kind": "backdoor", "num_malicious": 5, "join_round": 11},
        "participation": 0.5,
    },
}
VARIANTS: list[tuple[str, str, dict[str, Any]]] = [
    ("none", "none", {}),
    ("retrain", "retrain", {}),
    ("crab", "crab", {}),
    ("crab (no final tuning)", "crab", {"final_rounds": 0}),
    ("crab bounded", "crab", {"rollback": "bounded"}),
    ("crab paper", "crab", {"rollback": "paper", "rule": "literal", "final_rounds": 0}),
]
ROUNDS = 20
DETAIL_KEYS = (
    "rollback",
    "rule",
    "num_stored_rounds",
    "stored_rounds",
    "stored_malicious",
    "first_forgotten_round",
    "rollback_index",
    "rollback_round",
    "rollback_capped",
    "rollback_free_of_forgotten",
    "warnings",
    "final_rounds",
    "recovery_rounds",
)


def config(mnist: Path, setting: str, seed: int, rounds: int = ROUNDS) -> Any:
    """Return the run config of one setting and seed."""
    spec = SETTINGS[setting]
    return parse_config(
        {
            "seed": seed,
            "data": {
                "dataset": "mnist",
                "data_dir": str(mnist.resolve().parent),
                "num_clients": 20,
                "partition": "iid",
                "max_train_samples": 20_000,
            },
            "model": {"name": "cnn"},
            "training": {
                "rounds": rounds,
                "local_epochs": 1,
                "lr": 0.1,
                "batch_size": 64,
                "participation": spec.get("participation", 1.0),
            },
            "attack": {"target_label": 0, **spec["attack"]},
            "history": {"policy": "all", "crab": {"reference_size": 1000}},
        },
        f"crab/{setting}/seed{seed}",
    )


def asr_all(session: UnlearnSession, params: torch.Tensor) -> float | None:
    """Return ASR_all: the share of *all* triggered test inputs classified as the target."""
    evaluation = session.evaluation
    if evaluation.trigger is None:
        return None
    logits = predict_logits(evaluation.model, params, evaluation.trigger.apply(evaluation.x_test))
    return float((logits.argmax(1) == evaluation.target_label).double().mean())


def run_configuration(
    mnist: Path, out: Path, setting: str, seed: int, rounds: int = ROUNDS
) -> dict[str, Any]:
    """Train (or reuse) one run, recover with every variant and write its JSON."""
    run_dir = out / f"seed{seed}" / setting / "run"
    started = time.perf_counter()
    if (run_dir / "summary.json").exists():
        summary = json.loads((run_dir / "summary.json").read_text())
    else:
        if run_dir.exists():
            shutil.rmtree(run_dir)
        summary = train_run(config(mnist, setting, seed, rounds), run_dir)
    print(f"[{setting} seed {seed}] trained: {summary['final_metrics']}", flush=True)
    rows = []
    with UnlearnSession(run_dir, evaluate=False) as session:
        request = UnlearnRequest.of(sorted(session.run_view.malicious), "recover")
        for label, method, params in VARIANTS:
            unlearner = make_method(method, params)
            result = session.run(unlearner, request)
            quality = session.evaluation.evaluate(result.params)
            details = result.details.to_dict()
            rows.append(
                {
                    "label": label,
                    "method": method,
                    "params": params,
                    "test_accuracy": quality["test_accuracy"],
                    "backdoor_asr": quality.get("backdoor_asr"),
                    "backdoor_asr_all": asr_all(session, result.params),
                    "costs": result.costs.to_dict(),
                    "stored_bytes": unlearner.history_bytes_needed(session.context(request)),
                    "details": {k: details[k] for k in DETAIL_KEYS if k in details},
                }
            )
            print(
                f"[{setting} seed {seed}] {label}: TA {quality['test_accuracy']:.4f} "
                f"ASR {quality.get('backdoor_asr')} epochs {result.costs.client_epochs}",
                flush=True,
            )
    doc = {
        "setting": setting,
        "seed": seed,
        "config": session.run_view.config.model_dump(mode="json"),
        "malicious_clients": sorted(session.run_view.malicious),
        "train_summary": summary,
        "rows": rows,
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}",
        "torch": torch.__version__,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "wall_seconds": time.perf_counter() - started,
    }
    (run_dir.parent / "crab.json").write_text(json.dumps(doc, indent=2, default=str))
    return doc


def pct(x: float | None) -> str:
    """Format a rate as a percentage."""
    return "–" if x is None else f"{100 * x:.2f}"


def load(out: Path) -> dict[str, list[dict[str, Any]]]:
    """Return setting -> the configurations' JSON documents, by seed."""
    docs: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(out.glob("seed*/*/crab.json")):
        doc = json.loads(path.read_text())
        docs.setdefault(doc["setting"], []).append(doc)
    for v in docs.values():
        v.sort(key=lambda d: d["seed"])
    return docs


def summarize(out: Path) -> list[str]:
    """Return the Markdown tables: per seed, seed means, targets."""
    lines: list[str] = []
    docs = load(out)
    for setting in [s for s in SETTINGS if s in docs]:
        runs = docs[setting]
        att = runs[0]["config"]["attack"]
        lines += [
            f"### {setting}: {att['kind']}, {att['num_malicious']} of 20 malicious"
            + (f", joining at round {att['join_round']}" if att.get("join_round", 1) > 1 else "")
            + (
                f", participation {runs[0]['config']['training']['participation']}"
                if runs[0]["config"]["training"]["participation"] < 1
                else ""
            ),
            "",
            "| seed | variant | TA % | ASR_nt % | ASR_all % | client epochs (x Retrain) | "
            "j* | t_j* | first C_u round | final rounds | warnings |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for doc in runs:
            rows = {r["label"]: r for r in doc["rows"]}
            retrain_epochs = rows["retrain"]["costs"]["client_epochs"]
            for label, _, _ in VARIANTS:
                r = rows[label]
                d = r["details"]
                epochs = r["costs"]["client_epochs"]
                codes = sorted({w.split(":")[0] for w in d.get("warnings", [])})
                lines.append(
                    f"| {doc['seed']} | {label} | {pct(r['test_accuracy'])} | "
                    f"{pct(r['backdoor_asr'])} | {pct(r['backdoor_asr_all'])} | "
                    f"{epochs} ({epochs / retrain_epochs:.2f}) | "
                    f"{d.get('rollback_index', '–')} | {d.get('rollback_round', '–')} | "
                    f"{d.get('first_forgotten_round', '–')} | {d.get('final_rounds', '–')} | "
                    f"{', '.join(codes) or '–'} |"
                )
        lines += ["", *means(runs), "", *targets(runs), ""]
    return lines


def means(runs: list[dict[str, Any]]) -> list[str]:
    """Return the seed means of TA, ASR and the epoch ratio per variant."""
    out = [
        f"Mean over seeds {[d['seed'] for d in runs]}:",
        "",
        "| variant | TA % | ASR_nt % | client epochs / Retrain |",
        "|---|---|---|---|",
    ]
    for label, _, _ in VARIANTS:
        ta, asr, ratio = [], [], []
        for d in runs:
            by = {r["label"]: r for r in d["rows"]}
            ta.append(100 * by[label]["test_accuracy"])
            if by[label]["backdoor_asr"] is not None:
                asr.append(100 * by[label]["backdoor_asr"])
            ratio.append(
                by[label]["costs"]["client_epochs"] / by["retrain"]["costs"]["client_epochs"]
            )
        out.append(
            f"| {label} | {statistics.mean(ta):.2f} | "
            f"{f'{statistics.mean(asr):.2f}' if asr else '–'} | {statistics.mean(ratio):.2f} |"
        )
    return out


def targets(runs: list[dict[str, Any]]) -> list[str]:
    """Return the issue's targets per seed: default Crab and the paper's, against Retrain."""
    out = [
        "| seed | variant | ASR_nt − Retrain (<= 3) | Retrain TA − TA (<= 3) | "
        "epochs / Retrain (<= 0.6) | met |",
        "|---|---|---|---|---|---|",
    ]
    for d in runs:
        by = {r["label"]: r for r in d["rows"]}
        base = by["retrain"]
        for label in ("crab", "crab paper"):
            r = by[label]
            asr_gap = (
                None
                if r["backdoor_asr"] is None
                else 100 * (r["backdoor_asr"] - base["backdoor_asr"])
            )
            ta_gap = 100 * (base["test_accuracy"] - r["test_accuracy"])
            ratio = r["costs"]["client_epochs"] / base["costs"]["client_epochs"]
            met = (asr_gap is None or asr_gap <= 3) and ta_gap <= 3 and ratio <= 0.6
            out.append(
                f"| {d['seed']} | {label} | {'–' if asr_gap is None else f'{asr_gap:.2f}'} | "
                f"{ta_gap:.2f} | {ratio:.2f} | {'yes' if met else 'no'} |"
            )
    return out


def main() -> None:
    """Run one configuration, or summarise every finished one."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mnist", type=Path, default=Path("/work/shared/data/mnist.npz"))
    parser.add_argument("--out", type=Path, default=Path("runs/crab"))
    parser.add_argument("--setting", choices=list(SETTINGS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="T (smoke tests only)")
    parser.add_argument("--summarize", action="store_true", help="print the tables and exit")
    args = parser.parse_args()
    if args.summarize:
        print("\n".join(summarize(args.out)))
        return
    if args.setting is None:
        raise SystemExit(f"--setting is required; one of {', '.join(SETTINGS)}")
    if not args.mnist.exists():
        raise SystemExit(f"MNIST not found at {args.mnist}; pass --mnist PATH/mnist.npz")
    run_configuration(args.mnist, args.out, args.setting, args.seed, args.rounds)


if __name__ == "__main__":
    main()
