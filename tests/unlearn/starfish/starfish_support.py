"""Helpers of the Starfish tests: the shared convex run's constants, a numpy ranking."""

from __future__ import annotations

import numpy as np

from fedunlearn.mpc import run_two_party
from fedunlearn.unlearn import UnlearnRequest

# The shared convex run (tests/unlearn/conftest.py CONVEX_RUN): L2-regularised LR on non-IID
# blobs, strongly convex.
ROUNDS = 12
WEIGHT_DECAY = 1e-3
LR = 0.05
FORGET = UnlearnRequest.of([0, 1])
REMAINING = (2, 3, 4, 5)
BIT_EXACT = {"selection_rate": 1.0, "precision": "model", "units": "delta"}


def small_run_config(seed, rounds):
    """A small convex run for the process tests: logreg on 3-class blobs, 5 Dirichlet clients."""
    return {
        "seed": seed,
        "data": {
            "dataset": "synthetic",
            "num_clients": 5,
            "partition": "dirichlet",
            "alpha": 0.5,
            "options": {"num_samples": 400, "num_features": 10, "num_classes": 3},
        },
        "model": {"name": "logreg"},
        "training": {
            "rounds": rounds,
            "local_epochs": 2,
            "lr": 0.05,
            "batch_size": 40,
            "weight_decay": 1e-3,
            "executor": "serial",
        },
        "history": {"policy": "all"},
    }


def cosine_ranking(session, targets, rounds=range(1, ROUNDS + 1)):
    """Plain numpy ranking of rounds by cos(sum of target deltas, M_r - M_{r-1})."""
    scores = []
    for r in rounds:
        store = session.run_view.store
        g = sum(store.read_update(r, t).double().numpy() for t in targets)
        y = (store.read_model(r) - store.read_model(r - 1)).double().numpy()
        scores.append(g @ y / (np.linalg.norm(g) * np.linalg.norm(y)))
    order = np.argsort(-np.asarray(scores), kind="stable")
    return [list(rounds)[i] for i in order]


def two_party(program, **kwargs):
    """Run ``program(party)`` as both 2PC parties with fixed dealer and local seeds."""
    return run_two_party(program, dealer_seed=3, local_seed=3, **kwargs)
