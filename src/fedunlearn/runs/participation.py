"""Who the run's seeded sampler drew, against the rows the store keeps (issue 33, item 3).

The store check reads who took part from the ``clients`` rows. A deletion made by hand that
removes a client's updates *and* its rows (and their fingerprints) leaves a store that reads as
"never held that client's updates". The rows are not the only witness: an in-process run draws
each round's participants with a seeded sampler (``fl.sampling``) from its config, so the draw
can be repeated and compared with the rows. A client the sampler drew whose row is gone, and
whom no deletion record covers, was deleted outside ``forget``: the store is damaged.

The draw is repeated only where it is known exactly: a plain in-process run (one shard, no
late joiners) whose store records no ``forget`` and no applied result (either changes who is
present in later rounds). Elsewhere the check says why it did not run; a committed history
(docs/verification.md, "Deletion that holds") is what covers those runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fedunlearn.config import RunConfig
from fedunlearn.errors import ConfigError, HistoryError, UnknownNameError
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs.rundir import HISTORY_DIR, SUMMARY_FILE, stored_config
from fedunlearn.runs.setup import sampler_of

__all__ = ["participation_gaps"]


def _not_derivable(store: HistoryStore, config: RunConfig | None, run_dir: Path) -> str | None:
    """Why the draws cannot be repeated exactly for this run, or None when they can."""
    if config is None:
        return "the store keeps no config"
    summary = run_dir / SUMMARY_FILE
    try:
        executor = json.loads(summary.read_text()).get("executor") if summary.exists() else None
    except (OSError, ValueError, AttributeError):
        executor = None
    if executor == "flower":
        return "Flower drew the participants (the run's sampler did not)"
    if config.training.shards > 1:
        return "an isolated-shards run (each shard draws its own)"
    if config.attack.join_round > 1:
        return "attackers join late (who is present changes)"
    if store.forget_records() or store.generation() > 0:
        return "clients were forgotten (who is present changes after that)"
    return None


def participation_gaps(store: HistoryStore, client_ids: Iterable[int]) -> dict[str, Any]:
    """Return the rounds where the seeded sampler drew one of ``client_ids`` but no row is kept.

    Args:
        store: The run's history store (read-only is enough), inside its run directory.
        client_ids: The clients a receipt is about.

    Returns:
        ``{"checked": bool, "missing": [[round, client], ...], "why": str | None}``;
        ``why`` says why the draws were not repeated (``checked`` False).
    """
    wanted = sorted({int(c) for c in client_ids})
    run_dir = store.file.parent.parent if store.file.parent.name == HISTORY_DIR else None
    try:
        config = stored_config(store)
    except (ConfigError, UnknownNameError, ValueError):
        config = None
    why = "the store lies outside a run directory" if run_dir is None else None
    if why is None and run_dir is not None:
        why = _not_derivable(store, config, run_dir)
    if why is not None or config is None:
        return {"checked": False, "missing": [], "why": why}
    sampler = sampler_of(config)
    members = list(range(config.data.num_clients))
    missing = []
    for round_ in store.rounds():
        if round_ == 0:
            continue
        drawn = set(sampler.draw(round_, members).ids)
        try:
            kept = {rec.client_id for rec in store.client_records(round_)}
        except HistoryError:
            kept = set()
        missing += [[round_, c] for c in wanted if c in drawn and c not in kept]
    return {"checked": True, "missing": missing, "why": None}
