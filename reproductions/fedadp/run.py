"""FedADP on real MNIST: unlearning 5 of 20 clients with and without DP, against the baselines.

Two experiments (the paper's Sec. VI-A3 metrics, at a small scale), each on three trained runs:

- ``backdoor``: the 5 targets plant a backdoor (4x4 patch, 50% of their samples, target 0);
  ASR is measured on the targets' own triggered data and on the triggered test set.
- ``mia``: the 5 targets are clean; MISR is the shadow-model member rate on their training data.

Runs: ``nodp`` (no DP, every update recorded: Retrain, FedRecover without periodic correction,
FedADP-without-DP with the selection derived from the full history, identical to the live policy),
``dp_train`` (``dp_scope: train_and_store``, live ``fedadp`` policy: the faithful method) and
``dp_store`` (``dp_scope: store_only``: clean training, noisy stored copies). Retrain runs once per
experiment (it is bit-identical on the three runs: same M_0, same seeds, no DP).
Then, on the backdoor experiment: λ and γ sweeps of FedADP-without-DP (selections derived from
the ``nodp`` run), an ε_max sweep (``store_only`` runs), trimmed mean and median in training and
unlearning (no DP), and a short run of the paper's CNN with DP (noise-to-signal).

    nice -n 10 python reproductions/fedadp/run.py --mnist ../shared/data/mnist.npz --out runs/fedadp

Setting: 500 MNIST training images per client (10k), 2,000 test images, MLP 784-128-10
(d = 101,770), E = 2, SGD lr 0.05, batch 64, T = 30, FedAvg, β = 0.1, λ = 0.6, γ = 0.7,
ε_0 = ε_min = 1, ε_max = 3, δ = 1e-5, S = auto (1-round pilot), standard noise. One seed.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shutil
import statistics
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression

from fedunlearn.config import RunConfig, parse_config
from fedunlearn.eval import reference_retrain
from fedunlearn.eval.judge import Judge
from fedunlearn.fl.engine import run_rounds
from fedunlearn.fl.metrics import predict_logits
from fedunlearn.fl.records import RoundRecord
from fedunlearn.privacy.local_training import ClippedTraining
from fedunlearn.runs import build_setup, train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnResult, UnlearnSession, make_method

TARGETS = [0, 1, 2, 3, 4]  # MIA experiment: the clean clients to forget
RATIOS = [0.5, 0.9]  # plus the defaults (λ 0.6, γ 0.7) of the main table
EPS_MAX = [2.0, 4.5]  # plus 3.0 of the main table
PAPER = {  # Sec. VI-B2/VI-B3, Fig. 3-4 (MNIST, 5 of 20, FedAvg, eps_max 3, lambda 0.6, gamma 0.7)
    "retrain": ">87 / <50 / <10",
    "fedrecover": ">87, <88.02 / <50 / <10",
    "fedadp_nodp": "95.71 / 47.8 / <10",
    "fedadp": "88.02 / 25.51 / 0.54",
}


def config(
    args: argparse.Namespace,
    *,
    backdoor: bool,
    policy: str,
    privacy: dict[str, Any] | None = None,
    aggregator: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
    rounds: int | None = None,
    local_epochs: int = 2,
) -> RunConfig:
    """Return one run's config."""
    return parse_config(
        {
            "seed": args.seed,
            "data": {
                "dataset": "mnist",
                "data_dir": str(args.mnist.resolve().parent),
                "num_clients": 20,
                "partition": "iid",
                "max_train_samples": 10_000,
                "max_test_samples": 2_000,
            },
            "model": model or {"name": "mlp", "hidden": [128]},
            "training": {
                "rounds": rounds or args.rounds,
                "local_epochs": local_epochs,
                "lr": 0.05,
                "batch_size": 64,
                "aggregator": aggregator or {"name": "fedavg"},
            },
            "attack": {"kind": "backdoor", "num_malicious": 5, "poison_fraction": 0.5}
            if backdoor
            else {"kind": "none"},
            "history": {"policy": policy, "crab": {"reference_size": 1000}},
            "privacy": privacy or {"enabled": False},
        },
        "fedadp_mnist",
    )


def train(args: argparse.Namespace, name: str, cfg: RunConfig) -> tuple[Path, dict[str, Any]]:
    """Train (or reuse) the run ``name``; return its directory and summary."""
    run_dir = args.out / name / "run"
    if (run_dir / "summary.json").exists() and not args.fresh:
        return run_dir, json.loads((run_dir / "summary.json").read_text())
    if run_dir.exists():
        shutil.rmtree(run_dir)
    started = time.perf_counter()
    summary = train_run(cfg, run_dir)
    fm = summary["final_metrics"]
    print(
        f"[{name}] trained in {time.perf_counter() - started:.0f} s: TA {fm['test_accuracy']:.4f}"
        f" ASR {fm.get('backdoor_asr')} NSR {fm.get('dp_noise_to_signal')}",
        flush=True,
    )
    return run_dir, summary


class PaperMIA:
    """The paper's MISR protocol (Sec. VI-A3): an attack fit on the FL model's logits.

    Logistic regression on the logit vector, fit on the targets' training samples (member) and
    half of the test set (non-member) through the FL model; MISR_target is the share of the
    targets' samples an unlearned model's logits are classified as members, MISR_test the same
    on the other half of the test set.
    """

    def __init__(self, session: UnlearnSession, forget: list[int], seed: int = 0) -> None:
        evaluation = session.evaluation
        self.model = evaluation.model
        data = [session.federation.client_data[c] for c in forget]
        self.members = torch.cat([d.x for d in data])
        perm = torch.randperm(len(evaluation.y_test), generator=torch.Generator().manual_seed(seed))
        half = len(perm) // 2
        x_test = evaluation.x_test
        self.fit_out, self.held_out = x_test[perm[:half]], x_test[perm[half:]]
        fl = session.run_view.final_params
        x = np.concatenate([self._logits(fl, self.members), self._logits(fl, self.fit_out)])
        y = np.r_[np.ones(len(self.members)), np.zeros(len(self.fit_out))]
        self.attack = LogisticRegression(max_iter=2000, class_weight="balanced").fit(x, y)

    def _logits(self, params: torch.Tensor, x: torch.Tensor) -> np.ndarray:
        return predict_logits(self.model, params, x).double().numpy()

    def __call__(self, params: torch.Tensor) -> dict[str, float]:
        """Return MISR_target, MISR_test and the balanced attack accuracy."""
        target = float(self.attack.predict(self._logits(params, self.members)).mean())
        test = float(self.attack.predict(self._logits(params, self.held_out)).mean())
        return {"misr_target": target, "misr_test": test, "misr_balanced": (target + 1 - test) / 2}


def row_of(
    judge: Judge | None,
    session: UnlearnSession,
    label: str,
    result: UnlearnResult,
    retrain: UnlearnResult | None,
) -> dict[str, Any]:
    """Return one table row: quality, attacks, costs, storage, privacy."""
    if judge is not None:
        row = judge.judge(result, retrain.params if retrain is not None else None)
    else:
        q = session.evaluation.evaluate(result.params)
        row = {"test_accuracy": q["test_accuracy"], "backdoor_asr": q.get("backdoor_asr")}
        row |= {"rounds": result.costs.rounds, "client_epochs": result.costs.client_epochs}
    details = result.details.to_dict()
    privacy = details.get("privacy", {})
    row |= {
        "label": label,
        "method": result.method,
        "variant": details.get("variant"),
        "stored_update_fraction": details.get("stored_update_fraction"),
        "stored_round_fraction": details.get("stored_round_fraction"),
        "negative_cos_fraction": details.get("negative_cos_fraction"),
        "total_epsilon": privacy.get("total_epsilon"),
        "epochs_vs_retrain": (
            result.costs.client_epochs / retrain.costs.client_epochs
            if retrain is not None and retrain.costs.client_epochs
            else None
        ),
        "details": {k: v for k, v in details.items() if k not in ("privacy",)},
    }
    return row


def experiment(args: argparse.Namespace, backdoor: bool) -> dict[str, Any]:
    """Train the three runs of one experiment and judge every method on them."""
    tag = "backdoor" if backdoor else "mia"
    dp = {"enabled": True, "clip_norm": "auto", "epsilon_max": 3.0}
    runs = {
        "nodp": train(args, f"{tag}_nodp", config(args, backdoor=backdoor, policy="all")),
        "dp_train": train(
            args, f"{tag}_dp_train", config(args, backdoor=backdoor, policy="fedadp", privacy=dp)
        ),
        "dp_store": train(
            args,
            f"{tag}_dp_store",
            config(
                args,
                backdoor=backdoor,
                policy="fedadp",
                privacy={**dp, "dp_scope": "store_only"},
            ),
        ),
    }
    forget = runs["nodp"][1]["malicious_clients"] if backdoor else TARGETS
    request = UnlearnRequest.of(forget, "recover" if backdoor else "forget")
    plan = {
        "nodp": [
            ("FL model (no DP)", "none", None),
            ("Retrain", "retrain", None),
            ("FedRecover (no correction)", "fedrecover", {"correction_period": None}),
            ("FedADP without DP", "fedadp", None),
            ("FedADP-noDP, fresh ĝ (ablation)", "fedadp", {"calibration": "fresh"}),
            ("FedADP-noDP, FedEraser norm (ablation)", "fedadp", {"calibration": "norm"}),
        ],
        "dp_train": [
            ("FL model (DP, train_and_store)", "none", None),
            ("FedADP (train_and_store)", "fedadp", None),
            ("FedADP (train_and_store), clamp cos", "fedadp", {"clamp_negative_cos": True}),
        ],
        "dp_store": [
            ("FL model (DP, store_only)", "none", None),
            ("FedADP (store_only)", "fedadp", None),
        ],
    }
    rows, retrain = [], None
    for run, items in plan.items():
        run_dir, summary = runs[run]
        with UnlearnSession(run_dir) as session:
            judge = Judge(session.run_view, session.evaluation, request, seed=0)
            paper_mia = PaperMIA(session, forget)
            for label, method, params in items:
                result = session.run(make_method(method, params), request)
                if method == "retrain":
                    retrain = result
                row = row_of(judge, session, label, result, retrain)
                row |= paper_mia(result.params)
                row["run"] = run
                row["train_final"] = summary["final_metrics"]
                rows.append(row)
                print(
                    f"[{tag}] {label}: TA {row['test_accuracy']:.4f} "
                    f"ASR {row.get('backdoor_asr_forgotten')} MISR {row['mia_member_rate']:.3f} "
                    f"epochs {row['client_epochs']}",
                    flush=True,
                )
    dirs = {k: str(v[0]) for k, v in runs.items()}
    return {"experiment": tag, "forget": forget, "rows": rows, "runs": dirs}


def ratio_sweeps(args: argparse.Namespace) -> dict[str, Any]:
    """λ and γ sweeps of FedADP-noDP (selections derived from the backdoor no-DP run)."""
    run_dir, summary = train(args, "backdoor_nodp", config(args, backdoor=True, policy="all"))
    request = UnlearnRequest.of(summary["malicious_clients"], "recover")
    out: dict[str, Any] = {"lambda": [], "gamma": []}
    with UnlearnSession(run_dir) as session:
        for key, field in (("lambda", "round_ratio"), ("gamma", "client_ratio")):
            for value in RATIOS:
                res = session.run(make_method("fedadp", {field: value}), request)
                row = row_of(None, session, f"{key}={value}", res, None)
                out[key].append(row)
                print(f"[sweep] {key}={value}: TA {row['test_accuracy']:.4f}", flush=True)
    return out


def eps_sweep(args: argparse.Namespace, scope: str = "store_only") -> dict[str, Any]:
    """ε_max sweep of FedADP (literal and clamped cos) on DP runs of ``scope``."""
    dp = {"enabled": True, "clip_norm": "auto", "epsilon_max": 3.0}
    out: dict[str, Any] = {"eps_max": []}
    tag = "store" if scope == "store_only" else "train"
    for eps in EPS_MAX:
        priv = {**dp, "epsilon_max": eps, "dp_scope": scope}
        rd, sm = train(
            args, f"eps{eps}_{tag}", config(args, backdoor=True, policy="fedadp", privacy=priv)
        )
        request = UnlearnRequest.of(sm["malicious_clients"], "recover")
        with UnlearnSession(rd) as session:
            for label, params in (("", None), (", clamp cos", {"clamp_negative_cos": True})):
                res = session.run(make_method("fedadp", params), request)
                row = row_of(None, session, f"{scope} eps_max={eps}{label}", res, None)
                row["fl_test_accuracy"] = sm["final_metrics"]["test_accuracy"]
                out["eps_max"].append(row)
                print(f"[sweep] {row['label']}: TA {row['test_accuracy']:.4f}", flush=True)
    return out


def aggregators(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Trimmed mean (k = 2) and median in training and unlearning: Retrain and FedADP-noDP."""
    out = []
    for agg in ({"name": "trimmed_mean", "trim": 2}, {"name": "median"}):
        cfg = config(args, backdoor=True, policy="all", aggregator=agg, rounds=args.agg_rounds)
        run_dir, summary = train(args, f"agg_{agg['name']}", cfg)
        request = UnlearnRequest.of(summary["malicious_clients"], "recover")
        with UnlearnSession(run_dir) as session:
            retrain = session.run(make_method("retrain"), request)
            for label, res in (
                ("FL model", session.run(make_method("none"), request)),
                ("Retrain", retrain),
                ("FedADP without DP", session.run(make_method("fedadp"), request)),
            ):
                row = row_of(None, session, label, res, retrain)
                row["aggregator"] = agg["name"]
                out.append(row)
                print(f"[agg {agg['name']}] {label}: TA {row['test_accuracy']:.4f}", flush=True)
    return out


def cnn(args: argparse.Namespace) -> dict[str, Any]:
    """A short DP run of the paper's CNN (d = 582,026): accuracy and measured noise-to-signal."""
    dp = {"enabled": True, "clip_norm": "auto", "epsilon_max": 3.0}
    cfg = config(
        args,
        backdoor=False,
        policy="none",
        privacy=dp,
        model={"name": "cnn"},
        rounds=args.cnn_rounds,
        local_epochs=1,
    )
    run_dir, summary = train(args, "cnn_dp", cfg)
    ledger = json.loads((run_dir / "privacy.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        "num_params": summary["num_params"],
        "test_accuracy": [m["test_accuracy"] for m in metrics],
        "noise_to_signal": [m.get("dp_noise_to_signal") for m in metrics],
        "clip_norm": ledger["clip_norm"],
        "noise_std": [r["noise_std"] for r in ledger["rounds"]],
        "predicted_nsr_eps3": 1.6149 * math.sqrt(summary["num_params"] / 20),
    }


# ----- the paper's CNN under DP-SGD (issue 13) -------------------------------------------------

#: The CNN setting (reduced from the paper's for a 2-core CPU; README "DP-SGD on the paper's CNN").
CNN = {
    "clients": 20,
    "train_samples": 20_000,  # 1,000 per client (paper: 3,000)
    "rounds": 20,  # paper: 40
    "local_epochs": 1,  # paper: 5
    "batch_size": 64,  # expected Poisson batch B: q = 64 / 1000
    "attackers": 5,
    "poison_fraction": 1.0,  # the toolkit default, as in the Crab reproduction (README)
    "epsilon_max": 3.0,
    "delta": 1e-5,
}
#: SGD lr of the no-DP control (the Crab reproduction's, on the same data and CNN).
NODP_LR = 0.1
#: Targets of issue 13 for the DP-SGD CNN run.
DPSGD_TARGETS = {
    "fl_asr_min": 0.80,
    "fl_ta_min": 0.85,
    "fedadp_asr_max": 0.10,
    "ta_gap_max": 0.03,
    "epochs_ratio_max": 0.5,
}


def dpsgd_config(args: argparse.Namespace, seed: int, *, rounds: int | None = None) -> RunConfig:
    """Return the DP-SGD CNN run of ``seed`` (live ``fedadp`` policy, mechanism ``dp_sgd``)."""
    return parse_config(
        {
            "seed": seed,
            "data": {
                "dataset": "mnist",
                "data_dir": str(args.mnist.resolve().parent),
                "num_clients": CNN["clients"],
                "partition": "iid",
                "max_train_samples": args.cnn_train_samples,
            },
            "model": {"name": "cnn"},
            "training": {
                "rounds": rounds or args.dpsgd_rounds,
                "local_epochs": CNN["local_epochs"],
                "lr": args.dpsgd_lr,
                "batch_size": CNN["batch_size"],
            },
            "attack": {
                "kind": "backdoor",
                "num_malicious": CNN["attackers"],
                "poison_fraction": CNN["poison_fraction"],
            },
            "history": {"policy": "fedadp"},
            "privacy": {
                "enabled": True,
                "mechanism": "dp_sgd",
                "clip_norm": args.dpsgd_clip,
                "delta": CNN["delta"],
                "epsilon_initial": 1.0,
                "epsilon_min": 1.0,
                "epsilon_max": CNN["epsilon_max"],
            },
        },
        f"fedadp_cnn_dpsgd/seed{seed}",
    )


def clipped_training(cfg: RunConfig) -> dict[str, Any]:
    """Train ``cfg``'s federation, all clients, with DP-SGD's optimiser but no noise.

    Per-example clipping at C, Poisson batches, the run's lr (``ClippedTraining``, as unlearning
    trains on a dp_sgd run): it separates what the noise costs from what clipping costs.
    """
    started = time.perf_counter()
    setup = build_setup(cfg)
    try:
        fed = setup.federation
        fed.local_training = ClippedTraining(
            fed.model, fed.client_data, clip_norm=float(cfg.privacy.clip_norm)
        )
        rows: list[list[float]] = []

        class _Log:
            def on_round_end(self, record: RoundRecord) -> None:
                q = setup.evaluate(record.global_after)
                rows.append([record.round, q["test_accuracy"], q.get("backdoor_asr")])

        run_rounds(
            fed,
            setup.aggregator,
            setup.initial_params,
            num_rounds=cfg.training.rounds,
            observers=[_Log()],
        )
    finally:
        setup.close()
    return {
        "test_accuracy": rows[-1][1],
        "backdoor_asr": rows[-1][2],
        "train_seconds": time.perf_counter() - started,
        "per_round": rows,
    }


def _unlearn_row(session: UnlearnSession, result: UnlearnResult) -> dict[str, Any]:
    """TA, ASR and costs of one unlearning result (and FedADP's selection figures)."""
    q = session.evaluation.evaluate(result.params)
    details = result.details.to_dict()
    return {
        "test_accuracy": q["test_accuracy"],
        "backdoor_asr": q.get("backdoor_asr"),
        "rounds": result.costs.rounds,
        "client_epochs": result.costs.client_epochs,
        "stored_rounds": details.get("stored_rounds"),
        "stored_update_fraction": details.get("stored_update_fraction"),
        "negative_cos_fraction": details.get("negative_cos_fraction"),
        "step_ratio": details.get("step_ratio"),
        "final_rounds": details.get("final_rounds"),
        "calibration": details.get("calibration"),
        "seconds": result.costs.wall_seconds,
    }


def _fl_rounds(run_dir: Path) -> list[list[float]]:
    """Return [round, TA, ASR] of every round of a training run (from its metrics.jsonl)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    return [[m["round"], m["test_accuracy"], m.get("backdoor_asr")] for m in rows]


def dpsgd_seed(args: argparse.Namespace) -> dict[str, Any]:
    """Train the DP-SGD CNN run of ``args.seed``: FedADP (default, paper), Retrain, DP Retrain.

    DP Retrain is the receipt's reference (``fedunlearn.eval.reference_retrain``: the run's
    DP-SGD at its stored ε_t and seeds). With ``--dpsgd-extras`` also the clamped-cos ablation
    and the same config without DP and with clipped noise-free SGD. Writes
    ``OUT/dpsgd/seed{S}.json`` after every part; a re-run reuses the finished training runs and
    computes only the parts that are missing.
    """
    seed = args.seed
    root = args.out / "dpsgd"
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"seed{seed}.json"
    cfg = dpsgd_config(args, seed)
    run_dir, summary = train(args, f"dpsgd/seed{seed}", cfg)
    ledger = json.loads((run_dir / "privacy.json").read_text())
    forget = summary["malicious_clients"]
    request = UnlearnRequest.of(forget, "recover")
    doc: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    doc |= {
        "seed": seed,
        "setting": CNN
        | {
            "train_samples": args.cnn_train_samples,
            "rounds": cfg.training.rounds,
            "lr": args.dpsgd_lr,
            "clip_norm": args.dpsgd_clip,
        },
        "machine": doc.get("machine")
        or f"{platform.machine()}, {platform.processor() or '?'}, "
        f"{torch.get_num_threads()} torch threads",
        "date": doc.get("date") or datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "forget": forget,
        "fl": {
            "test_accuracy": summary["final_metrics"]["test_accuracy"],
            "backdoor_asr": summary["final_metrics"].get("backdoor_asr"),
            "train_seconds": summary["wall_seconds"],
            "per_round": _fl_rounds(run_dir),
        },
        "privacy": {k: v for k, v in ledger.items() if k != "rounds"},
        "ledger_rounds": ledger["rounds"],
    }

    def save() -> None:
        path.write_text(json.dumps(doc, indent=2, default=str))

    save()
    parts: tuple[tuple[str, str, dict[str, Any] | None], ...] = (
        ("fedadp", "fedadp", None),  # the default: calibration auto (fresh), final_rounds auto
        ("fedadp_paper", "fedadp", {"preset": "paper"}),  # Eq. 11, no tuning (issue 13's row)
        ("retrain_dp", "", None),  # the receipt's reference (saved before the slower extras)
        ("retrain_nodp", "retrain", None),
    )
    if args.dpsgd_extras:
        parts += (("fedadp_clamp", "fedadp", {"preset": "paper", "clamp_negative_cos": True}),)
    if any(key not in doc for key, _, _ in parts):
        with UnlearnSession(run_dir) as session:
            for key, method, params in parts:
                if key in doc:
                    continue
                if key == "retrain_dp":  # the run's DP-SGD at its stored ε_t and seeds
                    started = time.perf_counter()
                    result = reference_retrain(session, request, "retrain")
                    doc["retrain_dp"] = row = _unlearn_row(session, result)
                    row["seconds"] = time.perf_counter() - started
                    row["privacy"] = doc["privacy"]  # the same per-round ε_t as the run
                    save()
                    print(
                        f"[dpsgd seed {seed}] DP retrain: TA {row['test_accuracy']:.4f} "
                        f"ASR {row['backdoor_asr']:.4f} epochs {row['client_epochs']}",
                        flush=True,
                    )
                    continue
                result = session.run(make_method(method, params), request)
                doc[key] = row = _unlearn_row(session, result)
                save()
                print(
                    f"[dpsgd seed {seed}] {key}: TA {row['test_accuracy']:.4f} "
                    f"ASR {row['backdoor_asr']:.4f} epochs {row['client_epochs']} "
                    f"step ratio {row['step_ratio']}",
                    flush=True,
                )
    if not args.dpsgd_extras:
        print("\n".join(dpsgd_tables([doc])), flush=True)
        return doc
    if "fl_nodp" not in doc:  # the backdoor without DP, at the non-private lr of this setting
        nodp = parse_config(
            {
                **cfg.model_dump(),
                "training": {**cfg.training.model_dump(), "lr": NODP_LR},
                "privacy": {"enabled": False},
                "history": {"policy": "none"},
            },
            f"fedadp_cnn_dpsgd/seed{seed}_nodp",
        )
        nodp_dir, nodp_summary = train(args, f"dpsgd/seed{seed}_nodp_lr{NODP_LR}", nodp)
        final = nodp_summary["final_metrics"]
        doc["fl_nodp"] = {
            "lr": NODP_LR,
            "test_accuracy": final["test_accuracy"],
            "backdoor_asr": final.get("backdoor_asr"),
            "train_seconds": nodp_summary["wall_seconds"],
            "per_round": _fl_rounds(nodp_dir),
        }
        save()
    if "fl_clipped" not in doc:  # the DP run's optimiser without its noise: what the noise costs
        doc["fl_clipped"] = clipped_training(cfg)
        save()
    print("\n".join(dpsgd_tables([doc])), flush=True)
    return doc


def _med(values: Sequence[float | None]) -> str:
    """Median, min and max of a rate in percent."""
    vals = [v for v in values if v is not None]
    if not vals:
        return "–"
    return f"{100 * statistics.median(vals):.2f} ({100 * min(vals):.2f}–{100 * max(vals):.2f})"


def dpsgd_checks(doc: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """Return each issue-13 target of one seed as (figure, met?)."""
    t = DPSGD_TARGETS
    fl, adp, dp = doc["fl"], doc["fedadp"], doc["retrain_dp"]
    gap = dp["test_accuracy"] - adp["test_accuracy"]
    ratio = adp["client_epochs"] / dp["client_epochs"]
    return {
        "FL ASR >= 80%": (pct(fl["backdoor_asr"]), fl["backdoor_asr"] >= t["fl_asr_min"]),
        "FL TA >= 85%": (pct(fl["test_accuracy"]), fl["test_accuracy"] >= t["fl_ta_min"]),
        "FedADP ASR <= 10%": (pct(adp["backdoor_asr"]), adp["backdoor_asr"] <= t["fedadp_asr_max"]),
        "FedADP TA >= DP Retrain - 3": (f"{100 * -gap:+.2f} pts", gap <= t["ta_gap_max"]),
        "epochs <= 0.5x Retrain": (f"{ratio:.2f}x", ratio <= t["epochs_ratio_max"]),
    }


def dpsgd_tables(docs: Sequence[dict[str, Any]]) -> list[str]:
    """Return the Markdown tables of the DP-SGD CNN seeds (one row per seed and method)."""
    docs = sorted(docs, key=lambda d: d["seed"])
    lines = [
        "| seed | model | TA % | ASR % | rounds | client epochs | epochs / DP Retrain "
        "| stored update fraction | negative cos θ | step ratio Σ‖U‖/Σ‖ĝ‖ | total ε PLD "
        "| total ε RDP |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d in docs:
        dp = d["retrain_dp"]
        eps = d["privacy"]["totals"]["1"]
        dp_eps = dp["privacy"]["totals"]["1"]
        rows = [
            (f"FL model without DP (lr {NODP_LR})", d.get("fl_nodp"), None, None),
            ("FL model, clipped SGD without noise", d.get("fl_clipped"), None, None),
            ("FL model (DP-SGD)", d["fl"], None, eps),
            ("**FedADP** (default)", d["fedadp"], dp["client_epochs"], eps),
            ("FedADP, paper preset (Eq. 11)", d.get("fedadp_paper"), dp["client_epochs"], eps),
            ("FedADP, clamped cos θ (ablation)", d.get("fedadp_clamp"), dp["client_epochs"], eps),
            ("Retrain, no noise (clipped SGD)", d.get("retrain_nodp"), dp["client_epochs"], None),
            ("DP Retrain", dp, dp["client_epochs"], dp_eps),
        ]
        for label, r, base, e in rows:
            if r is None:
                continue
            epochs = r.get("client_epochs") or 0
            rounds = r.get("rounds")  # an int for unlearning rows (older files: FL trajectories)
            rounds = rounds if isinstance(rounds, int) else d["setting"]["rounds"]
            lines.append(
                f"| {d['seed']} | {label} | {pct(r['test_accuracy'])} | {pct(r['backdoor_asr'])} "
                f"| {rounds} | {epochs} "
                f"| {num(epochs / base, '.2f') if base and epochs else '–'} "
                f"| {num(r.get('stored_update_fraction'), '.3f')} "
                f"| {num(r.get('negative_cos_fraction'), '.2f')} "
                f"| {num(r.get('step_ratio'), '.3f')} "
                f"| {num(e['pld_epsilon'], '.2f') if e else '–'} "
                f"| {num(e['rdp_epsilon'], '.2f') if e else '–'} |"
            )
    lines += [
        "",
        "Median (min–max) over seeds " + ", ".join(str(d["seed"]) for d in docs) + ":",
        "",
    ]
    lines += ["| model | TA % | ASR % |", "|---|---|---|"]
    for label, key in (
        ("FL model without DP", "fl_nodp"),
        ("FL model, clipped SGD without noise", "fl_clipped"),
        ("FL model (DP-SGD)", "fl"),
        ("FedADP (default)", "fedadp"),
        ("FedADP, paper preset", "fedadp_paper"),
        ("FedADP, clamped cos θ", "fedadp_clamp"),
        ("Retrain, no noise (clipped SGD)", "retrain_nodp"),
        ("DP Retrain", "retrain_dp"),
    ):
        have = [d[key] for d in docs if d.get(key)]
        if not have:
            continue
        lines.append(
            f"| {label} | {_med([r['test_accuracy'] for r in have])} "
            f"| {_med([r['backdoor_asr'] for r in have])} |"
        )
    lines += ["", "| target | " + " | ".join(f"seed {d['seed']}" for d in docs) + " |"]
    lines.append("|---|" + "---|" * len(docs))
    checks = [dpsgd_checks(d) for d in docs]
    for name in checks[0] if checks else []:
        cells = [f"{c[name][0]} {'met' if c[name][1] else '**missed**'}" for c in checks]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| seed | σ_t range | ε_t per round | q | steps | clipped share (median) "
        "| noise-to-signal (median) | train s | FedADP s | DP Retrain s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d in docs:
        p, rows = d["privacy"], d["ledger_rounds"]
        eps = ", ".join(f"{r['epsilon']:.2f}" for r in rows)
        clipped = statistics.median(r["clipped_fraction"] for r in rows)
        lines.append(
            f"| {d['seed']} | {p['noise_multiplier_min']:.3f}–{p['noise_multiplier_max']:.3f} "
            f"| {eps} | {p['sample_rate_max']:.4f} | {p['steps_max']} | {clipped:.2f} "
            f"| {num(p['noise_to_signal_median'], '.2f')} | {d['fl']['train_seconds']:.0f} "
            f"| {d['fedadp']['seconds']:.0f} | {d['retrain_dp']['seconds']:.0f} |"
        )
    return lines


def pct(x: float | None) -> str:
    """Format a rate as a percentage."""
    return "–" if x is None else f"{100 * x:.2f}"


def num(x: float | None, fmt: str = ".3f") -> str:
    """Format a number or a dash."""
    return "–" if x is None else format(x, fmt)


def tables(doc: dict[str, Any]) -> list[str]:
    """Return the Markdown tables of a results document."""
    lines: list[str] = []
    for tag in ("backdoor", "mia"):
        if tag not in doc:
            continue
        lines += [
            f"### {tag}: forget {doc[tag]['forget']}",
            "",
            "| method | run | TA | ASR (targets) | ASR (test) | MISR (shadow) | MISR (paper) "
            "| MISR test | rounds | client epochs | epochs / Retrain | stored update fraction "
            "| total ε (PLD, δ=1e-5) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in doc[tag]["rows"]:
            lines.append(
                f"| {r['label']} | {r['run']} | {pct(r['test_accuracy'])} "
                f"| {pct(r.get('backdoor_asr_forgotten'))} | {pct(r.get('backdoor_asr'))} "
                f"| {pct(r.get('mia_member_rate'))} | {pct(r.get('misr_target'))} "
                f"| {pct(r.get('misr_test'))} | {r['rounds']} | {r['client_epochs']} "
                f"| {num(r.get('epochs_vs_retrain'), '.2f')} "
                f"| {num(r.get('stored_update_fraction'), '.3f')} "
                f"| {num(r.get('total_epsilon'), '.2f')} |"
            )
        lines.append("")
    for part, key in (
        ("ratios", "lambda"),
        ("ratios", "gamma"),
        ("eps", "eps_max"),
        ("eps_train", "eps_max"),
    ):
        if part in doc:
            rows = doc[part].get(key, [])
            if not rows:
                continue
            lines += [
                f"### sweep {key} ({part})",
                "",
                "| setting | TA | ASR (test) | rounds | client epochs | stored update fraction "
                "| total ε | FL TA |",
                "|---|---|---|---|---|---|---|---|",
            ]
            for r in rows:
                lines.append(
                    f"| {r['label']} | {pct(r['test_accuracy'])} | {pct(r.get('backdoor_asr'))} "
                    f"| {r['rounds']} | {r['client_epochs']} "
                    f"| {num(r.get('stored_update_fraction'))} "
                    f"| {num(r.get('total_epsilon'), '.2f')} | {pct(r.get('fl_test_accuracy'))} |"
                )
            lines.append("")
    if "agg" in doc:
        lines += [
            "### aggregators (no DP)",
            "",
            "| aggregator | method | TA | ASR (test) | client epochs |",
            "|---|---|---|---|---|",
        ]
        for r in doc["agg"]:
            lines.append(
                f"| {r['aggregator']} | {r['label']} | {pct(r['test_accuracy'])} "
                f"| {pct(r.get('backdoor_asr'))} | {r['client_epochs']} |"
            )
        lines.append("")
    if "cnn" in doc:
        c = doc["cnn"]
        lines += [
            "### paper CNN with DP (train_and_store, ε_max = 3)",
            "",
            f"d = {c['num_params']}, S = {num(c['clip_norm'], '.4g')}, TA per round "
            f"{[pct(a) for a in c['test_accuracy']]}, measured noise-to-signal "
            f"{[num(x, '.1f') for x in c['noise_to_signal']]}, predicted z·sqrt(d/C) at ε = 3: "
            f"{num(c['predicted_nsr_eps3'], '.1f')}",
            "",
        ]
    return lines


def main() -> None:
    """Run the experiments and write ``fedadp_mnist.json`` (or ``dpsgd/seed{S}.json``)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mnist", type=Path, default=Path("../shared/data/mnist.npz"))
    parser.add_argument("--out", type=Path, default=Path("runs/fedadp_mnist"))
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--cnn-rounds", type=int, default=2)
    parser.add_argument("--agg-rounds", type=int, default=None, help="rounds of the agg runs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--parts",
        nargs="*",
        default=["backdoor", "ratios", "mia", "eps", "agg", "cnn"],
        help="MLP parts, or 'dpsgd': the paper's CNN under DP-SGD, one seed (--seed)",
    )
    parser.add_argument("--cnn-train-samples", type=int, default=CNN["train_samples"])
    parser.add_argument("--dpsgd-rounds", type=int, default=CNN["rounds"], help="T (smoke tests)")
    parser.add_argument("--dpsgd-lr", type=float, default=1.0, help="SGD lr of the DP-SGD CNN")
    parser.add_argument("--dpsgd-clip", type=float, default=1.0, help="C per example")
    parser.add_argument(
        "--dpsgd-extras",
        action="store_true",
        help="also the clamped ablation, the no-DP and the clipped noise-free FL runs",
    )
    parser.add_argument("--fresh", action="store_true", help="retrain runs that exist")
    parser.add_argument("--tables", action="store_true", help="only print the Markdown tables")
    parser.add_argument(
        "--summarize", action="store_true", help="print the DP-SGD CNN tables of every seed"
    )
    args = parser.parse_args()
    path = args.out / "fedadp_mnist.json"
    if args.summarize:
        docs = [json.loads(p.read_text()) for p in sorted((args.out / "dpsgd").glob("seed*.json"))]
        if not docs:
            raise SystemExit(f"no DP-SGD results under {args.out / 'dpsgd'}; run --parts dpsgd")
        print("\n".join(dpsgd_tables(docs)))
        return
    if args.tables:
        print("\n".join(tables(json.loads(path.read_text()))))
        return
    if not args.mnist.exists():
        raise SystemExit(f"MNIST not found at {args.mnist}; pass --mnist PATH/mnist.npz")
    torch.set_num_threads(2)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.parts == ["dpsgd"]:
        dpsgd_seed(args)
        return
    doc: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    parts = {
        "backdoor": lambda: experiment(args, True),
        "mia": lambda: experiment(args, False),
        "ratios": lambda: ratio_sweeps(args),
        "eps": lambda: eps_sweep(args),
        "eps_train": lambda: eps_sweep(args, "train_and_store"),
        "agg": lambda: aggregators(args),
        "cnn": lambda: cnn(args),
    }
    for name in args.parts:
        if name not in parts:
            raise SystemExit(f"unknown part {name!r}; use {', '.join(parts)} or dpsgd (alone)")
        started = time.perf_counter()
        doc[name] = parts[name]()
        doc[f"{name}_seconds"] = time.perf_counter() - started
        path.write_text(json.dumps(doc, indent=2, default=str))
        print(f"== {name} done in {doc[f'{name}_seconds']:.0f} s", flush=True)
    doc["paper"] = PAPER
    path.write_text(json.dumps(doc, indent=2, default=str))
    print("\n".join(tables(doc)))


if __name__ == "__main__":
    main()
