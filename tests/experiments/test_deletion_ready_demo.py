"""The demo's deletion-ready part: requests served one after the other, each exact and applied."""

from __future__ import annotations

import pytest

from fedunlearn.config import parse_config
from fedunlearn.experiments.deletion_ready import DEMO_DELETION_READY, serve_requests
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import HISTORY_DIR, train_run

pytestmark = pytest.mark.slow


def test_requests_are_served_in_turn_exactly_and_cheaper_than_retrain(tmp_path):
    small = {
        **DEMO_DELETION_READY,
        "data": {**DEMO_DELETION_READY["data"], "num_clients": 30},
        "training": {**DEMO_DELETION_READY["training"], "rounds": 8, "local_steps": 4},
    }
    run = tmp_path / "run"
    train_run(parse_config(small), run)
    with HistoryStore.open(run / HISTORY_DIR) as store:
        drawn = {r.client_id for t in range(1, 9) for r in store.client_records(t)}
    never = min(set(range(30)) - drawn)
    clients = [never, min(drawn), max(drawn)]

    served = serve_requests(run, clients)

    assert served["retrain_trajectories"] == 8  # K = 1 draw in each of the 8 rounds
    rows = served["requests"]
    assert [r["client"] for r in rows] == clients
    assert rows[0]["trajectories"] == 0
    assert rows[0]["recomputed_from"] is None
    assert all(r["influence"] == "removed" for r in rows)
    assert all(r["lineage"] == "exact" for r in rows)
    assert all(r["trajectories"] <= served["retrain_trajectories"] for r in rows)
    with HistoryStore.open(run / HISTORY_DIR) as store:
        assert store.generation() == 3
        assert store.forgotten_clients() == set(clients)
