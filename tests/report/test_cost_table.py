"""The cost columns of a comparison (issue 35): both savings from the same rows, n/a without
Retrain; the distance figures say why a model can keep little of the original's offset and
still lie farther from Retrain than the original."""

import math

import pytest
import torch

from fedunlearn.cli.receipt import check_line, distance_text
from fedunlearn.eval.distance import l2_distance
from fedunlearn.eval.mia.client_lira import share_toward
from fedunlearn.eval.receipt.rules.distance import across
from fedunlearn.experiments.compare import add_savings
from fedunlearn.report.tables import COST_NOTE, cost_rows, results_markdown, table_rows


def cost_row(method, epochs, seconds, receipt=0.5):
    return {
        "method": method,
        "client_epochs": epochs,
        "wall_seconds": seconds,
        "server_seconds": seconds / 2,
        "history_bytes_read": 274_000_000 if method != "retrain" else 0,
        "bytes_communicated": epochs * 800_000,
        "verification": {
            "verdict": "pass",
            "cost": {"judging_seconds": receipt, "shared_seconds": 40.0, "wall_seconds": 40.5},
        },
    }


def comparison(*rows):
    return {
        "run_dir": "runs/x",
        "request": {"forget": [3], "kind": "forget"},
        "malicious_clients": [3],
        "created": "2026-11-29",
        "machine": "x86_64",
        "fedunlearn_version": "0.1.0",
        "wall_seconds": 61.0,
        "config": {
            "data": {"dataset": "mnist", "num_clients": 100},
            "model": {"name": "mlp"},
            "training": {"rounds": 50, "local_epochs": 1},
            "attack": {"kind": "backdoor"},
        },
        "methods": list(rows),
    }


def test_both_savings_come_from_the_same_rows_and_say_what_they_measure():
    rows = [
        cost_row("none", 0, 0.001),
        cost_row("retrain", 496, 5.6),
        cost_row("fedrecover", 266, 5.6),
        cost_row("crab", 296, 4.8),
    ]
    add_savings(rows)
    by = {r["method"]: r for r in rows}
    for name in ("retrain", "fedrecover", "crab"):
        assert by[name]["epoch_saving_vs_retrain"] == pytest.approx(496 / by[name]["client_epochs"])
        assert by[name]["time_saving_vs_retrain"] == pytest.approx(5.6 / by[name]["wall_seconds"])
    assert by["none"]["epoch_saving_vs_retrain"] is None  # the control does no unlearning
    assert by["none"]["time_saving_vs_retrain"] is None
    header, cells = cost_rows(comparison(*rows))
    table = {row[0]: dict(zip(header, row, strict=True)) for row in cells}
    assert table["fedrecover"]["epochs saved vs retrain (x)"] == "1.86x"
    assert table["fedrecover"]["time saved vs retrain (x)"] == "1.00x"  # epochs saved, not time
    assert table["crab"]["epochs saved vs retrain (x)"] == "1.68x"
    assert table["crab"]["time saved vs retrain (x)"] == "1.17x"
    assert table["crab"]["method s"] == "4.8"
    assert table["crab"]["server s"] == "2.4"
    assert table["crab"]["history MB read"] == "274.00"
    assert table["crab"]["receipt s"] == "0.5"
    assert table["none"]["time saved vs retrain (x)"] == "n/a"
    # the Markdown table has the same columns, and says what they measure
    full_header, full_rows = table_rows(comparison(*rows))
    assert {"epochs saved vs retrain (x)", "time saved vs retrain (x)", "receipt s"} <= set(
        full_header
    )
    crab = dict(zip(full_header, full_rows[3], strict=True))
    assert crab["time saved vs retrain (x)"] == "1.17x"
    md = results_markdown(comparison(*rows))
    assert COST_NOTE in md
    assert "shared references and setup took 40.0 s; the whole comparison 61.0 s" in md


def test_without_a_retrain_row_both_savings_are_n_a_not_guessed():
    rows = [cost_row("crab", 296, 4.8), cost_row("fedrecover", 0, 0.0)]
    add_savings(rows)
    assert all(r["epoch_saving_vs_retrain"] is None for r in rows)
    assert all(r["time_saving_vs_retrain"] is None for r in rows)
    header, cells = cost_rows(comparison(*rows))
    saved = [header.index("epochs saved vs retrain (x)"), header.index("time saved vs retrain (x)")]
    assert [[row[i] for i in saved] for row in cells] == [["n/a", "n/a"], ["n/a", "n/a"]]
    # a document written before the time saving existed shows n/a, not a number
    old = {k: v for k, v in cost_row("crab", 296, 4.8).items()}
    old["epoch_saving_vs_retrain"] = 1.7
    assert cost_rows(comparison(old))[1][0][saved[1]] == "n/a"


def test_across_is_the_part_of_the_distance_orthogonal_to_the_originals_offset():
    torch.manual_seed(0)
    retrain = torch.randn(50)
    original = retrain + torch.randn(50)
    # a model that keeps 0.16 of the offset and moved far in another direction
    offset = original - retrain
    side = torch.randn(50)
    side -= (side @ offset) / (offset @ offset) * offset  # orthogonal to the offset
    model = retrain + 0.16 * offset + 1.35 * side * offset.norm() / side.norm()
    gap = l2_distance(original, retrain)
    relative = l2_distance(model, retrain) / gap
    toward = share_toward(model, retrain, original)
    assert toward == pytest.approx(0.16, abs=1e-4)
    assert relative > 1  # farther from Retrain than the original ...
    assert across(relative, toward) == pytest.approx(1.35, abs=1e-3)  # ... across the offset
    assert relative == pytest.approx(math.hypot(toward, across(relative, toward)))


def test_the_distance_line_explains_why_its_two_figures_differ():
    """Defect (issue 35): "1.36x the distance, 0.16 of the offset" stood with no explanation."""
    check = {
        "name": "distance",
        "verdict": "warn",
        "title": "distance to Retrain",
        "aspect": "influence",
        "value": 0.239 / 0.176,
        "evidence": {"toward_original": 0.16},
        "threshold": {"toward": 0.3},
        "codes": ["toward"],
    }
    line = check_line(check)
    assert "1.36x the original's distance = 0.16 along the original's offset from Retrain" in line
    assert "(exact retrains below 0.30) and 1.35 across it" in line
    assert distance_text(0.5, 0.3) == (
        "0.50x the original's distance = 0.30 along the original's offset from Retrain and "
        "0.40 across it"
    )
