"""Refusals of the methods that need a complete history: every round's model, every update.

FedRecover and Starfish both rebuild the trajectory from the global model of every round and
the stored update of each client they replay; a history that lacks some (an unfinished run, a
selective policy, updates deleted by ``forget()``) is refused here before any work, with the
same one-line error for each method.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedunlearn.errors import UnsupportedHistoryError
from fedunlearn.unlearn.context import UnlearnContext

__all__ = ["refuse_missing_updates", "require_every_round"]

SHOWN = 5  # (round, client) pairs named in the error


def require_every_round(context: UnlearnContext, method: str) -> None:
    """Refuse a history without the global model of every round 0..T.

    Raises:
        UnsupportedHistoryError: Some round is not in the history.
    """
    missing = sorted(set(range(context.num_rounds + 1)) - set(context.history.rounds()))
    if missing:
        raise UnsupportedHistoryError(
            f"{method} needs the global model of every round 0..{context.num_rounds}; "
            f"rounds {missing[:10]} are not in the history. Complete the run first."
        )


def refuse_missing_updates(missing: Sequence[tuple[int, int]], needs: str, why: str = "") -> None:
    """Refuse a history without the stored updates ``missing`` lists as (round, client).

    Args:
        missing: The (round, client id) pairs whose stored update is not in the history.
        needs: What the method needs, the error's opening (``"starfish needs ..."``).
        why: Appended after the list of pairs (``", e.g. deleted by forget()"``).

    Raises:
        UnsupportedHistoryError: ``missing`` is not empty.
    """
    if missing:
        shown = ", ".join(f"round {r} client {c}" for r, c in missing[:SHOWN])
        more = ", ..." if len(missing) > SHOWN else ""
        raise UnsupportedHistoryError(
            f"{needs}; {len(missing)} are missing ({shown}{more}){why}. Record with "
            "history.policy=all and keep the updates."
        )
