"""Rendering of receipts: verdict columns, reasons, the cheapest passing method, dropped panels."""

import pytest

from fedunlearn.report.plots import panels, plot_results
from fedunlearn.report.tables import cheapest_passing, results_markdown, table_rows


def row(method, verdict, epochs, reasons=(), model_verdict=None, **values):
    return {
        "method": method,
        "test_accuracy": 0.9,
        "backdoor_asr": None,
        "mia_auc": 0.5,
        "distance_to_retrain": 0.1,
        "client_epochs": epochs,
        "wall_seconds": 1.0,
        "round_metrics": [{"round": 3, "test_accuracy": 0.8}, {"round": 7, "test_accuracy": 0.9}],
        "verification": {
            "verdict": verdict,
            "model_verdict": model_verdict or verdict,
            "reasons": list(reasons),
        },
        **values,
    }


DOC = {
    "run_dir": "runs/x",
    "request": {"forget": [3], "kind": "forget"},
    "malicious_clients": [],
    "created": "2026-11-23",
    "machine": "x86_64",
    "fedunlearn_version": "0.1.0",
    "config": {
        "data": {"dataset": "digits", "num_clients": 10},
        "model": {"name": "mlp"},
        "training": {"rounds": 10, "local_epochs": 2},
        "attack": {"kind": "none"},
    },
    "methods": [
        row("none", "fail", 0, ["distance to Retrain: the model is still the original model"]),
        row("retrain", "warn", 100, ["stored data deleted: 4 bytes held"], model_verdict="pass"),
        row("crab", "fail", 10, ["membership: attacks still tell"]),
        row("fedrecover", "warn", 40, ["stored data deleted: 4 bytes held"], model_verdict="pass"),
        row("federaser", "warn", 30, ["utility: 3 points below"]),
    ],
}


def test_cheapest_passing_counts_only_the_checks_of_the_model():
    assert cheapest_passing(DOC)["method"] == "fedrecover"
    failing = {**DOC, "methods": [m for m in DOC["methods"] if m["method"] in ("none", "crab")]}
    assert cheapest_passing(failing) is None


def test_tables_show_each_verdict_and_every_reason():
    header, rows = table_rows(DOC, compact=True)
    assert header[-1] == "verdict"
    assert [r[-1] for r in rows][:3] == ["fail", "warn", "fail"]
    md = results_markdown(DOC)
    assert "- **crab**: fail" in md
    assert "  - membership: attacks still tell" in md
    assert (
        "Cheapest method whose influence is removed or not detected, with utility ok: "
        "**fedrecover** "
        "(40 client epochs)." in md
    )


def influence_row(method, influence, utility, epochs):
    out = row(method, "inconclusive", epochs)
    out["verification"].update(
        {"influence": influence, "influence_reason": f"{method} why", "utility": utility}
    )
    out["verification"]["store"] = "held"
    return out


def test_the_influence_verdict_is_shown_and_decides_the_cheapest_method():
    doc = {
        **DOC,
        "methods": [
            influence_row("none", "remains", "ok", 0),
            influence_row("retrain", "removed", "ok", 100),
            influence_row("crab", "not_shown", "ok", 10),  # cheaper, but not shown clean
            influence_row("fedrecover", "removed", "degraded", 20),
            influence_row("federaser", "not_detected", "ok", 40),
        ],
    }
    header, rows = table_rows(doc, compact=True)
    assert [r[-1] for r in rows] == ["remains", "removed", "not_shown", "removed", "not_detected"]
    assert cheapest_passing(doc)["method"] == "federaser"
    md = results_markdown(doc)
    assert "- **crab**: influence not_shown, utility ok, store held (crab why)" in md


@pytest.mark.slow
def test_panels_without_data_are_dropped(tmp_path):
    figures = panels(DOC)
    assert "backdoor_asr" not in figures["quality"]
    assert "test_accuracy" in figures["quality"]
    assert figures["rounds"] == ["test_accuracy"]
    assert figures["tradeoff"] == ["test_accuracy"]
    backdoored = {
        **DOC,
        "methods": [
            {**m, "backdoor_asr": 0.5 if m["method"] == "none" else 0.0} for m in DOC["methods"]
        ],
    }
    assert "backdoor_asr" in panels(backdoored)["quality"]
    paths = plot_results(DOC, tmp_path)
    assert [p.name for p in paths] == ["quality.png", "rounds.png", "tradeoff.png", "costs.png"]
