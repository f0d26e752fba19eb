"""Render a centralised comparison (``fedunlearn.experiments.central``): tables and plots.

``write_central`` writes ``results.json``, ``results.csv``, ``tables.md`` and plots from what
``run_central`` measured. The protocol, the paper (Huang et al., "Machine Unlearning with
Minimal Gradient Dependence for High Unlearning Ratios", §5, Tables 1-3) and every deviation
from it are described once, in ``fedunlearn.experiments.central``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["aggregate", "central_markdown", "plot_central", "write_central"]


_CSV_KEYS = (
    "dataset", "seed", "ratio", "label", "method", "k_steps", "test_accuracy", "agree_original",
    "dist_replay",
    "original_gap", "relative_dist", "mia_unl_precision", "mia_unl_recall", "mia_unl_auc",
    "mia_ret_precision", "mia_ret_recall", "mia_ret_auc", "wall_seconds", "replay_seconds",
    "fresh_seconds", "time_vs_retrain", "stored_bytes", "gradient_evals", "num_train",
    "num_params", "num_steps",
)  # fmt: skip


def aggregate(
    rows: list[dict[str, Any]], key: str
) -> dict[tuple[str, float, str], tuple[float, float, int]]:
    """Return (dataset, ratio, label) -> (mean, std, count) of ``key`` over seeds."""
    groups: dict[tuple[str, float, str], list[float]] = {}
    for row in rows:
        value = row.get(key)
        if value is None or (isinstance(value, float) and np.isnan(value)):
            continue
        groups.setdefault((row["dataset"], row["ratio"], row["label"]), []).append(float(value))
    return {k: (float(np.mean(v)), float(np.std(v)), len(v)) for k, v in groups.items()}


def _cell(stats: dict, key: tuple, fmt: str = "{:.3f}") -> str:
    if key not in stats:
        return "n/a"
    mean, std, count = stats[key]
    return fmt.format(mean) + (f" ± {fmt.format(std)}" if count > 1 else "")


def central_markdown(doc: dict[str, Any]) -> str:
    """Return the Table 1/2/3 analogues plus distance/time/memory as Markdown."""
    rows = doc["rows"]
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    ratios = list(dict.fromkeys(r["ratio"] for r in rows))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    seeds = sorted({r["seed"] for r in rows})
    lines = [f"Seeds: {seeds} (mean ± std over seeds when more than one).", ""]
    acc = aggregate(rows, "test_accuracy")
    lines += ["### Table 1 analogue: test accuracy", ""]
    lines += ["| ratio | method | " + " | ".join(datasets) + " |"]
    lines += ["|---|---|" + "---|" * len(datasets)]
    for ratio in ratios:
        for label in labels:
            cells = [_cell(acc, (d, ratio, label)) for d in datasets]
            lines.append(f"| {ratio:.0%} | {label} | " + " | ".join(cells) + " |")
    if any("mia_unl_precision" in r for r in rows):
        lines += [
            "",
            "### Table 2 analogue: MIA precision (recall) [AUC], Unl. = D_U, Ret. = D_R",
            "",
        ]
        head = " | ".join(f"{d} Unl. | {d} Ret." for d in datasets)
        lines += [f"| ratio | method | {head} |", "|---|---|" + "---|" * (2 * len(datasets))]
        stats = {
            k: aggregate(rows, f"mia_{k}")
            for k in (
                "unl_precision",
                "unl_recall",
                "unl_auc",
                "ret_precision",
                "ret_recall",
                "ret_auc",
            )
        }
        for ratio in ratios:
            for label in labels:
                cells = []
                for d in datasets:
                    for tag in ("unl", "ret"):
                        key = (d, ratio, label)
                        cells.append(
                            f"{_cell(stats[tag + '_precision'], key)} "
                            f"({_cell(stats[tag + '_recall'], key)}) "
                            f"[{_cell(stats[tag + '_auc'], key)}]"
                        )
                lines.append(f"| {ratio:.0%} | {label} | " + " | ".join(cells) + " |")
    dist, rel, wall, ratio_t = (
        aggregate(rows, k)
        for k in ("dist_replay", "relative_dist", "wall_seconds", "time_vs_retrain")
    )
    bytes_ = aggregate(rows, "stored_bytes")
    lines += ["", "### Distance to replay retraining, time and stored history", ""]
    lines += [
        "| dataset | ratio | method | ‖w − w_replay‖ | relative to Original | "
        "unlearn s | time / retrain | stored MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for d in datasets:
        for ratio in ratios:
            for label in labels:
                key = (d, ratio, label)
                if key not in dist:
                    continue
                mb = bytes_[key][0] / 1e6 if key in bytes_ else float("nan")
                lines.append(
                    f"| {d} | {ratio:.0%} | {label} | {_cell(dist, key, '{:.2e}')} | "
                    f"{_cell(rel, key)} | {_cell(wall, key, '{:.3f}')} | "
                    f"{_cell(ratio_t, key, '{:.3f}')} | {mb:.2f} |"
                )
    return "\n".join(lines) + "\n"


def plot_central(doc: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write ``accuracy.png`` (per dataset and method) and ``distance_vs_k.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = doc["rows"]
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    ratios = list(dict.fromkeys(r["ratio"] for r in rows))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    acc = aggregate(rows, "test_accuracy")
    fig, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 4), squeeze=False)
    for ax, d in zip(axes[0], datasets, strict=True):
        width = 0.8 / len(ratios)
        for i, ratio in enumerate(ratios):
            vals = [acc.get((d, ratio, lab), (0.0, 0.0, 0))[0] for lab in labels]
            ax.bar(np.arange(len(labels)) + i * width, vals, width, label=f"{ratio:.0%}")
        ax.set_xticks(
            np.arange(len(labels)) + 0.4 - width / 2, labels, rotation=60, ha="right", fontsize=7
        )
        ax.set_title(f"{d}: test accuracy", fontsize=10)
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)
    fig.tight_layout()
    paths = [out / "accuracy.png"]
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for d in datasets:
        for ratio in ratios:
            pts = sorted(
                (r["k_steps"], r["relative_dist"])
                for r in rows
                if r["dataset"] == d
                and r["ratio"] == ratio
                and r["k_steps"]
                and r["seed"] == rows[0]["seed"]
                and "L-BFGS" not in r["label"]
            )
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=f"{d} {ratio:.0%}")
    ax.set_xscale("log")
    ax.set_xlabel("k (steps)")
    ax.set_ylabel("‖w − w_replay‖ / ‖w_T − w_replay‖")
    ax.set_title("Mini-Unlearning: distance to replay vs window", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "distance_vs_k.png")
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)
    return paths


def write_central(doc: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """Write ``results.json``, ``results.csv``, ``tables.md`` and the plots into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "csv": out / "results.csv", "md": out / "tables.md"}
    paths["json"].write_text(json.dumps(doc, indent=1, default=str))
    with paths["csv"].open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(_CSV_KEYS), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(doc["rows"])
    paths["md"].write_text(central_markdown(doc))
    for path in plot_central(doc, out):
        paths[path.stem] = path
    return paths
