"""The refusals FedRecover and Starfish share (unlearn.complete_history): the same errors."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fedunlearn.errors import UnsupportedHistoryError
from fedunlearn.unlearn.complete_history import refuse_missing_updates, require_every_round


def _context(num_rounds, rounds):
    return SimpleNamespace(num_rounds=num_rounds, history=SimpleNamespace(rounds=lambda: rounds))


def test_a_history_without_some_round_is_refused_with_the_rounds_named():
    require_every_round(_context(3, [0, 1, 2, 3]), "starfish")  # complete: nothing raised
    with pytest.raises(UnsupportedHistoryError) as err:
        require_every_round(_context(12, [0, 1]), "fedrecover")
    assert str(err.value) == (
        "fedrecover needs the global model of every round 0..12; rounds [2, 3, 4, 5, 6, 7, 8, 9, "
        "10, 11] are not in the history. Complete the run first."
    )


def test_missing_updates_are_refused_with_at_most_five_named():
    refuse_missing_updates([], "starfish needs every client's stored update")  # none missing
    missing = [(r, 3) for r in range(1, 8)]
    with pytest.raises(UnsupportedHistoryError) as err:
        refuse_missing_updates(
            missing,
            "fedrecover needs every remaining client's stored update",
            ", e.g. deleted by forget()",
        )
    assert str(err.value) == (
        "fedrecover needs every remaining client's stored update; 7 are missing (round 1 client "
        "3, round 2 client 3, round 3 client 3, round 4 client 3, round 5 client 3, ...), e.g. "
        "deleted by forget(). Record with history.policy=all and keep the updates."
    )
    with pytest.raises(UnsupportedHistoryError) as err:
        refuse_missing_updates(
            [(2, 0)], "starfish needs every client's stored update (Stage I shares)"
        )
    assert str(err.value) == (
        "starfish needs every client's stored update (Stage I shares); 1 are missing (round 2 "
        "client 0). Record with history.policy=all and keep the updates."
    )
