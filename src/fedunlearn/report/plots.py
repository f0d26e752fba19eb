"""Plots of a comparison: quality per method, quality along the replayed rounds, quality vs cost.

``plot_results`` writes ``quality.png`` (bars: test accuracy, backdoor ASR, membership AUC,
distance to Retrain), ``rounds.png`` (test accuracy and ASR against the original round each
unlearning round replays), ``tradeoff.png`` (quality against client epochs, the marker showing
each method's verdict) and ``costs.png``. Panels whose values are all zero or missing (ASR in a
run without a backdoor) are left out, and legends sit beside the axes, never over the data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# (key, title, scale): "pct" bars are fractions in [0, 1], "auc" has a chance line at 0.5
_BARS = (
    ("test_accuracy", "test accuracy", "pct"),
    ("backdoor_asr", "backdoor ASR (test)", "pct"),
    ("mia_auc", "membership AUC (forgotten clean data)", "auc"),
    ("distance_to_retrain", "L2 distance to Retrain", "abs"),
)
_VERDICT_MARKERS = {
    "pass": "o",
    "warn": "^",
    "fail": "X",
    "removed": "o",
    "not_detected": "D",
    "not_shown": "^",
    "remains": "X",
    None: "s",
}


def _save(fig: Any, path: Path, rect: tuple[float, float, float, float] | None = None) -> Path:
    """Lay ``fig`` out (within ``rect``, leaving room for a side legend), write it, close it."""
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _colors(methods: list[dict[str, Any]]) -> dict[str, str]:
    """Return one color per method, the same in every figure."""
    return {m["method"]: f"C{i % 10}" for i, m in enumerate(methods)}


def _verdict(row: dict[str, Any]) -> str | None:
    verification = row.get("verification")
    if verification is None:
        return None
    return verification.get("influence", verification["verdict"])


def _has_signal(values: list[Any]) -> bool:
    """Return whether a panel has anything to show (a value that is neither missing nor 0)."""
    return any(v is not None and v != 0 for v in values)


def _bar_panel(ax: Any, names: list[str], values: list[Any], title: str, scale: str) -> None:
    shown = [v if v is not None else 0.0 for v in values]
    colors = [
        "#888888" if n == "none" else "#1f77b4" if n == "retrain" else "#ff7f0e" for n in names
    ]
    bars = ax.bar(range(len(names)), shown, color=colors)
    for bar, v in zip(bars, values, strict=True):
        if v is None:
            label = "n/a"
        elif scale == "pct":
            label = f"{100 * v:.0f}%"
        elif scale == "auc":
            label = f"{v:.2f}"
        else:
            label = f"{v:.2g}"
        ax.annotate(
            label,
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    if scale in ("pct", "auc"):
        ax.set_ylim(0, 1.12)
    else:
        ax.set_ylim(0, max(shown + [1e-9]) * 1.15)
    if scale == "auc":
        ax.axhline(0.5, color="#555555", ls=":", lw=1)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)


def panels(doc: dict[str, Any]) -> dict[str, list[str]]:
    """Return the keys each figure plots: a panel whose values are all 0 or missing is dropped."""
    methods = doc["methods"]
    lines = [("test_accuracy", ""), ("backdoor_asr", "")]
    return {
        "quality": [b[0] for b in _BARS if _has_signal([m.get(b[0]) for m in methods])],
        "rounds": [
            k
            for k, _ in lines
            if _has_signal([r.get(k) for m in methods for r in m["round_metrics"]])
        ]
        or ["test_accuracy"],
        "tradeoff": [k for k, _ in lines if _has_signal([m.get(k) for m in methods])]
        or ["test_accuracy"],
    }


_TITLES = {"test_accuracy": "test accuracy", "backdoor_asr": "backdoor ASR (test)"}


def _quality(doc: dict[str, Any], out: Path) -> Path:
    methods = doc["methods"]
    names = [m["method"] for m in methods]
    shown = panels(doc)["quality"]
    panels_ = [b for b in _BARS if b[0] in shown]
    fig, axes = plt.subplots(1, len(panels_), figsize=(4.2 * len(panels_), 3.9), squeeze=False)
    for ax, (key, title, scale) in zip(axes[0], panels_, strict=True):
        _bar_panel(ax, names, [m.get(key) for m in methods], title, scale)
    req = doc["request"]
    fig.suptitle(f"{req['kind']} clients {req['forget']}: quality after unlearning", fontsize=11)
    return _save(fig, out / "quality.png")


def _rounds(doc: dict[str, Any], out: Path) -> Path:
    methods = doc["methods"]
    keys = [("test_accuracy", "test accuracy"), ("backdoor_asr", "backdoor ASR (test)")]
    keys = [
        k for k in keys if _has_signal([r.get(k[0]) for m in methods for r in m["round_metrics"]])
    ] or keys[:1]
    fig, axes = plt.subplots(1, len(keys), figsize=(6 * len(keys) + 1.6, 4), squeeze=False)
    control = next((m for m in methods if m["method"] == "none"), None)
    colors = _colors(methods)
    for ax, (key, title) in zip(axes[0], keys, strict=True):
        for m in methods:
            rows = m["round_metrics"]
            if not rows:
                continue
            xs = [r.get("round", i) for i, r in enumerate(rows, start=1)]
            ax.plot(
                xs,
                [r.get(key) for r in rows],
                marker=".",
                label=m["method"],
                color=colors[m["method"]],
            )
        if control is not None and control.get(key) is not None:
            ax.axhline(control[key], color="#888888", ls="--", lw=1, label="none (original)")
        ax.set_xlabel("original round replayed")
        ax.set_ylabel(title)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=8, frameon=False)
    fig.suptitle("model quality along each method's unlearning rounds", fontsize=11)
    return _save(fig, out / "rounds.png", (0, 0, 1 - 1.6 / (6 * len(keys) + 1.6), 1))


def _tradeoff(doc: dict[str, Any], out: Path) -> Path:
    methods = doc["methods"]
    keys = [(k, _TITLES[k]) for k in panels(doc)["tradeoff"]]
    fig, axes = plt.subplots(1, len(keys), figsize=(5.2 * len(keys) + 2.4, 4), squeeze=False)
    colors = _colors(methods)
    for ax, (key, title) in zip(axes[0], keys, strict=True):
        for m in methods:
            if m.get(key) is None:
                continue
            verdict = _verdict(m)
            ax.scatter(
                m["client_epochs"],
                m[key],
                marker=_VERDICT_MARKERS.get(verdict, "s"),
                color=colors[m["method"]],
                edgecolors="black",
                linewidths=0.5,
                s=70,
                zorder=3,
            )
        ax.set_xlabel("client local epochs (cost)")
        ax.set_ylabel(title)
        ax.set_ylim(-0.02, 1.05)
        ax.grid(alpha=0.3)
    handles = [
        plt.Line2D(
            [], [], ls="", marker="o", color=colors[m["method"]], label=m.get("label", m["method"])
        )
        for m in methods
    ]
    handles += [
        plt.Line2D(
            [],
            [],
            ls="",
            marker=_VERDICT_MARKERS[v],
            color="white",
            markeredgecolor="black",
            label=v,
        )
        for v in ("removed", "not_detected", "not_shown", "remains")
    ]
    fig.legend(handles=handles, loc="center right", fontsize=8, frameon=False)
    fig.suptitle("quality against cost (marker: the receipt's influence verdict)", fontsize=11)
    return _save(fig, out / "tradeoff.png", (0, 0, 1 - 2.4 / (5.2 * len(keys) + 2.4), 1))


def _costs(doc: dict[str, Any], out: Path) -> Path:
    methods = doc["methods"]
    names = [m["method"] for m in methods]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    axes[0].bar(names, [m["client_epochs"] for m in methods], color="#2ca02c")
    axes[0].set_title("client local epochs", fontsize=10)
    axes[1].bar(names, [m["wall_seconds"] for m in methods], color="#9467bd")
    axes[1].set_title("unlearning wall time (s)", fontsize=10)
    for ax in axes:
        ax.tick_params(axis="x", rotation=30)
        ax.grid(axis="y", alpha=0.3)
    return _save(fig, out / "costs.png")


def plot_results(doc: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write ``quality.png``, ``rounds.png``, ``tradeoff.png`` and ``costs.png``; return them."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [_quality(doc, out), _rounds(doc, out), _tradeoff(doc, out), _costs(doc, out)]
