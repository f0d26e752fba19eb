"""Plots of a comparison: quality bars per method, accuracy per unlearning round, costs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

_BARS = (
    ("test_accuracy", "test accuracy"),
    ("backdoor_asr", "backdoor ASR (test)"),
    ("mia_member_rate", "MIA member rate (forgotten data)"),
)


def _bar_panel(ax: Any, names: list[str], values: list[Any], title: str) -> None:
    shown = [v if v is not None else 0.0 for v in values]
    colors = [
        "#888888" if n == "none" else "#1f77b4" if n == "retrain" else "#ff7f0e" for n in names
    ]
    bars = ax.bar(range(len(names)), shown, color=colors)
    for bar, v in zip(bars, values, strict=True):
        label = "n/a" if v is None else f"{100 * v:.0f}%"
        ax.annotate(
            label,
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_ylim(0, 1.12)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)


def plot_results(doc: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write ``quality.png``, ``rounds.png`` and ``costs.png`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    methods = doc["methods"]
    names = [m["method"] for m in methods]
    paths = []

    fig, axes = plt.subplots(1, len(_BARS), figsize=(4.2 * len(_BARS), 3.8))
    for ax, (key, title) in zip(axes, _BARS, strict=True):
        _bar_panel(ax, names, [m.get(key) for m in methods], title)
    req = doc["request"]
    fig.suptitle(f"{req['kind']} clients {req['forget']}: quality after unlearning", fontsize=11)
    fig.tight_layout()
    paths.append(out / "quality.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    has_asr = any("backdoor_asr" in r for m in methods for r in m["round_metrics"])
    panels = 2 if has_asr else 1
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4), squeeze=False)
    for m in methods:
        rows = m["round_metrics"]
        if not rows:
            continue
        steps = list(range(1, len(rows) + 1))
        axes[0][0].plot(
            steps, [r.get("test_accuracy") for r in rows], marker=".", label=m["method"]
        )
        if has_asr:
            axes[0][1].plot(
                steps, [r.get("backdoor_asr") for r in rows], marker=".", label=m["method"]
            )
    for ax in (m for row in axes for m in row):
        if "none" in names:
            ref = next(m for m in methods if m["method"] == "none")
            key = "test_accuracy" if ax is axes[0][0] else "backdoor_asr"
            if ref.get(key) is not None:
                ax.axhline(ref[key], color="#888888", ls="--", lw=1, label="none (original)")
        ax.set_xlabel("unlearning round")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("test accuracy")
    fig.suptitle("model quality along each method's unlearning rounds", fontsize=11)
    if has_asr:
        axes[0][1].set_ylabel("backdoor ASR (test)")
    fig.tight_layout()
    paths.append(out / "rounds.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    epochs = [m["client_epochs"] for m in methods]
    walls = [m["wall_seconds"] for m in methods]
    axes[0].bar(names, epochs, color="#2ca02c")
    axes[0].set_title("client local epochs", fontsize=10)
    axes[1].bar(names, walls, color="#9467bd")
    axes[1].set_title("unlearning wall time (s)", fontsize=10)
    for ax in axes:
        ax.tick_params(axis="x", rotation=30)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    paths.append(out / "costs.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths
