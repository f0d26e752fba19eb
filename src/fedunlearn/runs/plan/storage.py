"""What a run's history store will hold, before training (issue 35, item 5).

Every stored tensor is the model's flat float32 vector (P parameters, 4 bytes each). Per round
the store keeps the global model and the aggregate; the recording policy decides which client
updates are kept (``history.policy``, fedunlearn.history.policy):

    all:    R (n + 2) P 4 + P 4    bytes   (n: updates per round, M_0 once)
    every:  (R_k n + 2 R) P 4 + P 4        (R_k = ceil(R / k): rounds 1, 1 + k, 1 + 2k, ...)
    none:   (2 R + 1) P 4
    shards: + S R P 4 under any policy (``training.shards`` S > 1: each shard's model, every round)

With ``history.encoding: float16`` each update takes P 2 bytes instead of P 4 (global models
and aggregates stay float32; an update float16 cannot hold, one with a value beyond 65,504, is
kept in float32, so the figure is then a lower bound).
n is the expected number of distinct clients per round (``participation``: exactly
max(1, ceil(p M)); ``tv_stable``: M (1 - (1 - 1/M)^K), so the figure is an expectation).
Selective policies installed by plugins (Crab's windows, FedADP's stages) keep a subset that
depends on training; the ``all`` figure bounds them. Not counted: rejected uploads (kept with
their reason) and SQLite's own pages (about 0.4 MB for a
small store; ``fedunlearn info`` reports both after training). Measured against real stores in
tests/runs/test_plan_storage.py.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["StoragePrediction", "predict_storage"]

FLOAT_BYTES = 4
EXACT_POLICIES = ("all", "every", "none")


@dataclass(frozen=True)
class StoragePrediction:
    """Payload bytes the store will hold after R rounds (an upper bound for other policies)."""

    policy: str
    payload_bytes: int
    per_round_bytes: float
    exact: bool  # False: a bound (a selective policy) or an expectation (tv_stable draws)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values."""
        return asdict(self)


def predict_storage(
    policy: str,
    *,
    rounds: int,
    updates_per_round: float,
    num_params: int,
    every: int = 1,
    expectation: bool = False,
    update_bytes: int = FLOAT_BYTES,
    shards: int = 1,
) -> StoragePrediction:
    """Predict the store's payload bytes (module docstring).

    Args:
        policy: ``history.policy``.
        rounds: R.
        updates_per_round: n, the (expected) distinct clients aggregated per round.
        num_params: P.
        every: k of policy ``every``.
        expectation: n is an expectation (tv_stable draws), not a count.
        update_bytes: Bytes a stored update value takes (2 with ``history.encoding: float16``).
        shards: S, ``training.shards`` (1: not sharded).
    """
    model = num_params * FLOAT_BYTES
    if policy == "none":
        kept_rounds = 0
    elif policy == "every":
        kept_rounds = math.ceil(rounds / every)
    else:  # all, and the bound for a selective policy
        kept_rounds = rounds
    update = num_params * update_bytes
    total = (2 * rounds + 1) * model + kept_rounds * updates_per_round * update
    if shards > 1:
        total += shards * rounds * model
    return StoragePrediction(
        policy=policy,
        payload_bytes=int(round(total)),
        per_round_bytes=(total - model) / max(rounds, 1),
        exact=policy in EXACT_POLICIES and not expectation,
    )
