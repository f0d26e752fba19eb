"""A federation of 1,000 clients end to end (issue 35): train, store, unlearn, verify.

Logistic regression on synthetic blobs, 1,000 Dirichlet clients, 1% participation (10 clients a
round), 8 rounds, every update recorded. The store holds the participants' updates only (10 a
round, not 1,000), FedRecover and Crab unlearn one participant, and the store still verifies.
"""

from __future__ import annotations

import pytest
import torch

from fedunlearn.config import parse_config
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

pytestmark = pytest.mark.slow

CLIENTS, ROUNDS, PER_ROUND = 1000, 8, 10
FEATURES, CLASSES = 16, 4
DIM = (FEATURES + 1) * CLASSES  # logreg: weights and biases

CONFIG = {
    "seed": 3,
    "data": {
        "dataset": "synthetic",
        "num_clients": CLIENTS,
        "partition": "dirichlet",
        "alpha": 0.5,
        "min_client_samples": 1,
        "options": {"num_samples": 40000, "num_features": FEATURES, "num_classes": CLASSES},
    },
    "model": {"name": "logreg"},
    "training": {
        "rounds": ROUNDS,
        "participation": PER_ROUND / CLIENTS,
        "local_epochs": 1,
        "lr": 0.1,
        "batch_size": 8,
    },
    "history": {"policy": "all"},
}


@pytest.fixture(scope="module")
def thousand(tmp_path_factory):
    run = tmp_path_factory.mktemp("thousand") / "run"
    train_run(parse_config(CONFIG), run)
    return run


def test_store_holds_the_participants_only(thousand):
    with HistoryStore.open(thousand / "history") as store:
        store.verify()  # raises on damage
        participants = [
            [c.client_id for c in store.client_records(r) if c.status == "accepted"]
            for r in range(1, ROUNDS + 1)
        ]
        by_client = store.stored_bytes_by_client()
    assert [len(p) for p in participants] == [PER_ROUND] * ROUNDS
    assert all(0 <= c < CLIENTS for p in participants for c in p)
    # one float32 update per participation: the store grows with participations, not with M
    assert sum(by_client.values()) == PER_ROUND * ROUNDS * DIM * 4
    assert len(by_client) == len({c for p in participants for c in p}) < CLIENTS


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("fedrecover", {"warmup_rounds": 3, "correction_period": 3, "final_rounds": 1}),
        ("crab", {}),
    ],
)
def test_unlearning_a_participant_at_1000_clients(thousand, method, params):
    with HistoryStore.open(thousand / "history") as store:
        forget = sorted(c.client_id for c in store.client_records(1) if c.status == "accepted")[0]
    request = UnlearnRequest.of([forget])
    with UnlearnSession(thousand, evaluate=False) as session:
        retrain = session.run(make_method("retrain"), request)
        result = session.run(make_method(method, params), request)
        session.check_unchanged()
    assert torch.isfinite(result.params).all()
    assert result.params.numel() == DIM
    assert 0 < result.costs.client_epochs < retrain.costs.client_epochs
    if method == "fedrecover":  # the other rounds' updates are estimated, not trained
        assert result.costs.estimated_updates > 0
    # Retrain replays every round's other participants: 9 of round 1's, 10 (or 9) later
    assert PER_ROUND * ROUNDS - ROUNDS <= retrain.costs.client_epochs < PER_ROUND * ROUNDS
    with HistoryStore.open(thousand / "history") as store:
        store.verify()  # the methods only read it
