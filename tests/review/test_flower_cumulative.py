"""Review of issue 22 on the Flower app: a request after ``forget`` forgets the earlier client too.

``UnlearnSession.context`` makes every request cumulative (the method never asks a client
forgotten earlier), but ``unlearn_over_app`` built its summary, its receipt and the model
file's metadata from the request as named: after ``forget 0``, a request for client 1 said
``"forget": [1]`` and its receipt covered client 1 only, although the model also removed
client 0's influence and client 0's removal is what the request served.
"""

import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is not installed")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integrations"))

from flwr.app import MetricRecord  # noqa: E402
from test_flower_recording import NODES, OwnGrid, record, task_identity  # noqa: E402, F401

from fedunlearn.runs import forget_clients  # noqa: E402


@pytest.mark.slow
def test_a_flower_app_request_is_cumulative_in_its_summary_and_receipt(tmp_path):
    from fedunlearn.integrations.flower.app_unlearn import unlearn_over_app

    record(tmp_path, OwnGrid(NODES), rounds=2)
    forget_clients(tmp_path / "run", [0])
    grid = OwnGrid({11: {"partition-id": 1}, 12: {"partition-id": 0}, 13: {"partition-id": 2}})

    out = unlearn_over_app(
        grid,
        tmp_path / "run",
        "retrain",
        [1],
        evaluate_fn=lambda r, arrays: MetricRecord({"test_accuracy": 0.25}),
    )

    assert out["request"]["forget"] == [0, 1]
    assert out["request"]["new"] == [0, 1]  # client 0 was erased by forget, never applied
    assert sorted(out["client_check"]) == ["0", "1"]  # both clients' nodes report
    assert "clients 0, 1" in out["verification"]["lineage"]["reason"]
