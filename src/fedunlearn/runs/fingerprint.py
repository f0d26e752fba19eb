"""The digests naming a run's state and a receipt: what a result was computed on.

A result records the fingerprint of the run it was computed on (``run_fingerprint``); ``fedunlearn
apply`` and the chain signatures (``fedunlearn.runs.chain_signing``) compare it with the run as it
is, and an applied event keeps the digest of the result's receipt (``receipt_sha256``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fedunlearn.config import RunConfig

__all__ = ["receipt_sha256", "run_fingerprint"]


def run_fingerprint(config: RunConfig, generation: int = 0, last_round: int | None = None) -> str:
    """Return the SHA-256 naming a run as it is: its config, generation and last round.

    A run as trained (generation 0, at the config's last round) keeps the config's digest
    alone; an applied or continued run adds its generation and last round, so caches and
    results of an earlier state never match it.
    """
    text = config.model_dump_json()
    if generation or (last_round is not None and last_round != config.training.rounds):
        text += f"|generation {generation}|round {last_round}"
    return hashlib.sha256(text.encode()).hexdigest()


def receipt_sha256(verification: Any) -> str:
    """Return the SHA-256 of a receipt's canonical JSON ("" for None)."""
    if verification is None:
        return ""
    return hashlib.sha256(json.dumps(verification, sort_keys=True).encode()).hexdigest()
