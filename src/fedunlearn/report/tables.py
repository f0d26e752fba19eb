"""Write a results document as results.json, results.csv and results.md; name the cheapest pass.

Every table shows each method's verdict (its receipt's influence verdict: removed,
not_detected, not_shown, remains; older documents: the worst check); results.md lists the
influence verdict with its reason, the utility and store verdicts, and the reason of every
check that did not pass, so a failing method is never shown without saying so.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# what each cost column measures: docs/performance.md, "What the cost columns measure"
COST_COLUMNS = (
    ("method", "method", None),
    ("client_epochs", "client epochs", "int"),
    ("epoch_saving_vs_retrain", "epochs saved vs retrain (x)", "x"),
    ("wall_seconds", "method s", "f1"),
    ("server_seconds", "server s", "f1"),
    ("time_saving_vs_retrain", "time saved vs retrain (x)", "x"),
    ("history_bytes_read", "history MB read", "mb"),
    ("bytes_communicated", "MB communicated", "mb"),
    ("receipt_seconds", "receipt s", "f1"),
)

COLUMNS = (
    ("method", "method", None),
    ("verdict", "verdict", None),
    ("test_accuracy", "TA", "pct"),
    ("backdoor_asr", "ASR test", "pct"),
    ("backdoor_asr_forgotten", "ASR forgotten", "pct"),
    ("mia_member_rate", "MIA member rate", "pct"),
    ("mia_auc", "MIA AUC", "f3"),
    ("mia_loss_auc", "MIA loss AUC", "f3"),
    ("distance_to_retrain", "L2 to retrain", "f3"),
    ("rounds", "rounds", "int"),
    *(c for c in COST_COLUMNS if c[0] != "method"),
    ("stored_bytes", "stored MB", "mb"),
)

CSV_FIELDS = (
    "method",
    "verdict",
    "test_accuracy",
    "test_error",
    "test_loss",
    "backdoor_asr",
    "backdoor_asr_forgotten",
    "mia_member_rate",
    "mia_auc",
    "mia_precision",
    "mia_recall",
    "mia_loss_auc",
    "mia_loss_member_rate",
    "distance_to_retrain",
    "distance_to_original",
    "cosine_to_retrain",
    "toward_original",
    "rounds",
    "client_participations",
    "client_epochs",
    "estimated_updates",
    "epoch_saving_vs_retrain",
    "time_saving_vs_retrain",
    "wall_seconds",
    "server_seconds",
    "client_train_seconds",
    "evaluation_seconds",
    "receipt_seconds",
    "history_bytes_read",
    "bytes_communicated",
    "stored_bytes",
)

COST_NOTE = (
    "method s: the method's own wall time (per-round evaluation and the receipt excluded); "
    "server s: method s less the time spent waiting for client training; saved vs retrain: "
    "Retrain's epochs (time) / the method's, both measured in this comparison (n/a: no Retrain "
    "row, or the none control; the time ratio is one run each: on a shared machine a method's "
    "time varies by a third from run to run, more below a second, so repeat before quoting "
    "it); history MB read: stored payload the method read; MB "
    "communicated: model down and update up per client training; receipt s: measuring and "
    "checking this model (the references all receipts share are counted once, below)."
)


def _fmt(value: Any, style: str | None) -> str:
    if value is None:
        return "n/a" if style == "x" else "-"
    if style == "pct":
        return f"{100 * value:.1f}%"
    if style == "f3":
        return f"{value:.3f}"
    if style == "f1":
        return f"{value:.1f}"
    if style == "int":
        return f"{int(value):,}"
    if style == "x":
        return f"{value:.2f}x"
    if style == "mb":
        return f"{value / 1e6:.2f}"
    return str(value)


COMPACT = (
    "method",
    "test_accuracy",
    "backdoor_asr",
    "mia_auc",
    "distance_to_retrain",
    "verdict",
)  # the costs have a table of their own (``cost_rows``)
_SHORT = {
    "backdoor_asr": "ASR",
    "mia_auc": "MIA",
    "distance_to_retrain": "L2 retrain",
}


def table_rows(doc: dict[str, Any], *, compact: bool = False) -> tuple[list[str], list[list[str]]]:
    """Return the header and formatted cells of the summary table (``compact`` for terminals)."""
    columns = [c for c in COLUMNS if not compact or c[0] in COMPACT]
    if compact:
        columns.sort(key=lambda c: COMPACT.index(c[0]))
    header = [_SHORT.get(key, title) if compact else title for key, title, _ in columns]
    rows = [[_fmt(_cell(m, key), style) for key, _, style in columns] for m in doc["methods"]]
    return header, rows


def cost_rows(doc: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Return the header and formatted cells of the cost table (``COST_COLUMNS``)."""
    header = [title for _, title, _ in COST_COLUMNS]
    rows = [[_fmt(_cell(m, key), style) for key, _, style in COST_COLUMNS] for m in doc["methods"]]
    return header, rows


def shared_receipt_seconds(doc: dict[str, Any]) -> float | None:
    """Return the seconds of the references every receipt of the comparison shares, or None."""
    for row in doc["methods"]:
        cost = (row.get("verification") or {}).get("cost") or {}
        if cost.get("shared_seconds") is not None:
            return float(cost["shared_seconds"])
    return None


def _cell(row: dict[str, Any], key: str) -> Any:
    """Return a row's value; the method cell shows its ``label`` (method and variant) if any."""
    if key == "method":
        return row.get("label", row["method"])
    if key == "verdict":
        return verdict(row)
    if key == "receipt_seconds":
        return ((row.get("verification") or {}).get("cost") or {}).get("judging_seconds")
    return row.get(key)


def verdict(row: dict[str, Any]) -> str | None:
    """Return a row's influence verdict, or None.

    ``removed``, ``not_detected``, ``not_shown`` or ``remains``.
    Documents written before the influence verdict existed give their overall verdict.
    """
    verification = row.get("verification")
    if verification is None:
        return None
    return verification.get("influence", verification["verdict"])


def _shown_clean(verification: dict[str, Any]) -> bool:
    if "influence" in verification:
        return verification["influence"] in ("removed", "not_detected") and (
            verification.get("utility") == "ok"
        )
    return verification.get("model_verdict", verification["verdict"]) == "pass"


def cheapest_passing(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """Return the cheapest row with influence removed or not detected and utility ok, or None.

    ``removed``: by construction (an exact lineage); ``not_detected``: no check with power
    flags it.
    The store verdict does not count: whether the store still holds the forgotten clients'
    updates is the same for every method of a request. Older documents: ``model_verdict``.
    """
    passing = [
        m
        for m in doc["methods"]
        if m.get("verification") is not None
        and _shown_clean(m["verification"])
        and m["method"] != "none"
    ]
    if not passing:
        return None
    return min(passing, key=lambda m: (m["client_epochs"], m["wall_seconds"]))


def _reason_lines(doc: dict[str, Any]) -> list[str]:
    lines = []
    for row in doc["methods"]:
        verification = row.get("verification")
        if verification is None:
            continue
        name = row.get("label", row["method"])
        reasons = verification.get("reasons") or []
        if "influence" in verification:
            lines.append(
                f"- **{name}**: influence {verification['influence']}, utility "
                f"{verification.get('utility')}, store {verification.get('store')} "
                f"({verification.get('influence_reason', '')})"
            )
        else:
            lines.append(
                f"- **{name}**: {verification['verdict']}"
                + ("" if reasons else " (every check passed or did not apply)")
            )
        lines += [f"  - {reason}" for reason in reasons]
    best = cheapest_passing(doc)
    if best is not None:
        lines += [
            "",
            "Cheapest method whose influence is removed or not detected, with utility ok: "
            f"**{best.get('label', best['method'])}** "
            f"({best['client_epochs']:,} client epochs).",
        ]
    elif lines:
        lines += ["", "No method's influence was removed or not detected with utility ok."]
    return lines


def _shared_text(doc: dict[str, Any]) -> str:
    shared = shared_receipt_seconds(doc)
    total = doc.get("wall_seconds")
    parts = []
    if shared is not None:
        parts.append(f"The receipts' shared references and setup took {shared:.1f} s")
    if total is not None:
        parts.append(f"the whole comparison {total:.1f} s")
    return " " + "; ".join(parts) + "." if parts else ""


def results_markdown(doc: dict[str, Any]) -> str:
    """Return the results as a Markdown document with the summary table."""
    header, rows = table_rows(doc)
    req = doc["request"]
    cfg = doc["config"]
    lines = [
        f"# Unlearning comparison: {doc['run_dir']}",
        "",
        f"- request: {req['kind']} clients {req['forget']} "
        f"(malicious in the run: {doc['malicious_clients']})",
        f"- run: {cfg['data']['dataset']}, {cfg['data']['num_clients']} clients, "
        f"{cfg['model']['name']}, {cfg['training']['rounds']} rounds x "
        f"{cfg['training']['local_epochs']} local epochs, attack {cfg['attack']['kind']}",
        f"- created {doc['created']} on {doc['machine']}, fedunlearn {doc['fedunlearn_version']}",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
        "TA: test accuracy. ASR test: triggered non-target test inputs classified as the target. "
        "ASR forgotten: the same on the forgotten clients' own data. MIA: membership attacks on "
        "the forgotten clients' clean training data against unseen data: shadow-model attack "
        "(member rate, AUC) and loss-threshold attack (AUC); 0.5 is chance. Verdict: the "
        "receipt (docs/verification.md). " + COST_NOTE + _shared_text(doc),
        "",
    ]
    reasons = _reason_lines(doc)
    if reasons:
        lines += ["## Verification", "", *reasons, ""]
    return "\n".join(lines)


def write_results(doc: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """Write results.json, results.csv and results.md into ``out_dir``; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "csv": out / "results.csv", "md": out / "results.md"}
    tmp = paths["json"].with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, paths["json"])
    with paths["csv"].open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for m in doc["methods"]:
            cells = {
                k: _cell(m, k) if k in ("verdict", "receipt_seconds") else m.get(k)
                for k in CSV_FIELDS
            }
            writer.writerow({k: "" if v is None else v for k, v in cells.items()})
    paths["md"].write_text(results_markdown(doc))
    return paths
