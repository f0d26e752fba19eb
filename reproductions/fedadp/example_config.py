"""The FedADP example config (``configs/digits_fedadp.yaml``) under both DP mechanisms, per seed.

For each seed, trains the example as shipped (``privacy.mechanism: dp_sgd``) and as it was
before issue 13 (``client_update`` with ``clip_norm: auto`` and lr 0.1), then unlearns the two
backdoored clients with FedADP and with Retrain (no DP, the toolkit's reference) on each run,
and prints one Markdown table (the one in docs/privacy.md):

    flock /tmp/fedunlearn-heavy.lock nice -n 5 python reproductions/fedadp/example_config.py
        --out /tmp/fedadp_example --seeds 0 1 2      # (one line)

Paper: Jiang et al., "Efficient Federated Unlearning with Adaptive Differential Privacy
Preservation" (FedADP), Alg. 1-2, Eq. 4-6; the mechanisms: docs/privacy.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from fedunlearn.config import load_config
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

EXAMPLE = Path(__file__).resolve().parents[2] / "configs" / "digits_fedadp.yaml"
#: The example's mechanism and the pre-issue-13 one (same config otherwise).
VARIANTS: dict[str, dict[str, Any]] = {
    "dp_sgd": {},
    "client_update": {
        "privacy.mechanism": "client_update",
        "privacy.clip_norm": "auto",
        "training.lr": 0.1,
    },
}


def measure(out: Path, seed: int, variant: str) -> dict[str, Any]:
    """Train one variant and seed; return FL, FedADP and Retrain quality, costs and ε."""
    run_dir = out / f"{variant}_seed{seed}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    cfg = load_config(EXAMPLE, {"seed": seed, **VARIANTS[variant]})
    started = time.perf_counter()
    summary = train_run(cfg, run_dir)
    train_seconds = time.perf_counter() - started
    final = summary["final_metrics"]
    privacy = json.loads((run_dir / "privacy.json").read_text())
    row: dict[str, Any] = {
        "seed": seed,
        "variant": variant,
        "fl_ta": final["test_accuracy"],
        "fl_asr": final["backdoor_asr"],
        "total_epsilon": privacy["total_epsilon"],
        "noise_to_signal": privacy["noise_to_signal_median"],
        "train_seconds": train_seconds,
    }
    request = UnlearnRequest.of(summary["malicious_clients"], "recover")
    with UnlearnSession(run_dir) as session:
        for name in ("fedadp", "retrain"):
            result = session.run(make_method(name), request)
            q = session.evaluation.evaluate(result.params)
            row[f"{name}_ta"] = q["test_accuracy"]
            row[f"{name}_asr"] = q["backdoor_asr"]
            row[f"{name}_epochs"] = result.costs.client_epochs
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict[str, Any]]) -> list[str]:
    """Return the Markdown table: one row per variant and seed, then the medians."""

    def pct(x: float) -> str:
        return f"{100 * x:.1f}"

    lines = [
        "| mechanism | seed | FL TA % | FL ASR % | FedADP TA % | FedADP ASR % | Retrain TA % "
        "| FedADP / Retrain client epochs | total ε (PLD) | noise-to-signal (median) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["variant"] != "dp_sgd", r["seed"])):
        lines.append(
            f"| `{r['variant']}` | {r['seed']} | {pct(r['fl_ta'])} | {pct(r['fl_asr'])} "
            f"| {pct(r['fedadp_ta'])} | {pct(r['fedadp_asr'])} | {pct(r['retrain_ta'])} "
            f"| {r['fedadp_epochs']} / {r['retrain_epochs']} | {r['total_epsilon']:.2f} "
            f"| {r['noise_to_signal']:.2f} |"
        )
    for variant in VARIANTS:
        sel = [r for r in rows if r["variant"] == variant]
        if not sel:
            continue

        def med(key: str, sel: list[dict[str, Any]] = sel) -> str:
            return pct(statistics.median(r[key] for r in sel))

        lines.append(
            f"| `{variant}` | median | {med('fl_ta')} | {med('fl_asr')} | {med('fedadp_ta')} "
            f"| {med('fedadp_asr')} | {med('retrain_ta')} | | "
            f"{statistics.median(r['total_epsilon'] for r in sel):.2f} | |"
        )
    return lines


def main() -> None:
    """Measure every seed and variant; print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("/tmp/fedadp_example"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args()
    torch.set_num_threads(2)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [measure(args.out, s, v) for v in args.variants for s in args.seeds]
    (args.out / "example_config.json").write_text(json.dumps(rows, indent=2))
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
