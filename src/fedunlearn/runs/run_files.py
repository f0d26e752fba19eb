"""The files of a living run derived from its store, rewritten after an apply or a continuation.

``metrics.jsonl``, ``summary.json`` and (DP) ``privacy.json`` are functions of the store, the
authority: each is rewritten atomically after the store committed, so a full disk leaves the
earlier file whole and the one-line error says what was done and how to finish
(``rebuild_run_files``, ``fedunlearn verify RUN --rebuild``).
"""

from __future__ import annotations

import json
from pathlib import Path

from fedunlearn.config import RunConfig
from fedunlearn.errors import HistoryError, OutputError
from fedunlearn.history.store import FILE_NAME, HistoryStore
from fedunlearn.history.store.events import APPLIED_KEY
from fedunlearn.runs.rundir import (
    HISTORY_DIR,
    METRICS_FILE,
    PRIVACY_FILE,
    SUMMARY_FILE,
    load_run_config,
    run_privacy,
    stored_metrics_line,
    write_json,
    write_text_atomic,
)

__all__ = ["rebuild_run_files", "rewrite_files", "rewrite_metrics", "store_dir"]


def store_dir(run_dir: Path) -> Path:
    """Return the run's store directory; HistoryError if ``run_dir`` holds no run."""
    if not (run_dir / HISTORY_DIR / FILE_NAME).exists():
        raise HistoryError(
            f"{run_dir} is not a run directory (no {HISTORY_DIR}/{FILE_NAME}); name the "
            "directory given to 'fedunlearn train --out'"
        )
    return run_dir / HISTORY_DIR


def rewrite_metrics(run_dir: Path, store: HistoryStore) -> None:
    """Rewrite ``metrics.jsonl`` from the store, one line per round (atomically)."""
    last = store.last_round() or 0
    lines = [json.dumps(stored_metrics_line(store, r)) for r in range(1, last + 1)]
    write_text_atomic(run_dir / METRICS_FILE, "".join(line + "\n" for line in lines))


def _rewrite_summary(run_dir: Path, store: HistoryStore) -> None:
    """Make ``summary.json`` describe the run as it is now (after an apply or a continuation).

    Training wrote it for the trained model; after ``apply`` the run serves another model and
    after ``--continue`` it has more rounds, so the round count, the last round's metrics, the
    generation, the forgotten clients and the stored bytes are rewritten from the store (the
    other fields, e.g. the executor, are kept).
    """
    path = run_dir / SUMMARY_FILE
    try:
        summary = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, json.JSONDecodeError):
        summary = {}
    last = store.last_round() or 0
    metrics = {k: v for k, v in store.round_scalars(last).items() if k != APPLIED_KEY}
    summary.update(
        rounds=last,
        final_metrics=metrics,
        generation=store.generation(),
        forgotten_clients=sorted(store.forgotten_clients()),
        stored_bytes=store.stored_bytes(),
        file_bytes=store.file_bytes(),
    )
    write_json(path, summary)


def _rewrite_privacy(run_dir: Path, config: RunConfig, store: HistoryStore) -> None:
    """Rewrite ``privacy.json`` for the run as it is now (after an apply or a continuation)."""
    if config.privacy.enabled:
        write_json(run_dir / PRIVACY_FILE, run_privacy(config, store))


def rewrite_files(run_dir: Path, config: RunConfig, store: HistoryStore, done: str) -> None:
    """Rewrite the files derived from the store: ``metrics.jsonl``, ``summary.json``, privacy.

    Each is written atomically, so a full disk leaves the previous file whole; the store (the
    authority) is committed before, so the error says what was done and how to finish.

    Raises:
        OutputError: A file could not be written (naming it, what was committed and what to do).
    """
    try:
        rewrite_metrics(run_dir, store)
        _rewrite_summary(run_dir, store)
        _rewrite_privacy(run_dir, config, store)
    except OSError as err:
        where = err.filename or run_dir
        raise OutputError(
            f"{done} (the store is committed), but {where} could not be written "
            f"({err.strerror or err}); the earlier file is left whole. Free some space and "
            f"re-run the same command, or 'fedunlearn verify {run_dir} --rebuild', to rewrite "
            "metrics.jsonl, summary.json and privacy.json from the store"
        ) from None


def rebuild_run_files(run_dir: str | Path) -> list[str]:
    """Rewrite ``metrics.jsonl``, ``summary.json`` and (DP) ``privacy.json`` from the store.

    Takes the writer lock. ``summary.json`` keeps the fields it has and gets the store's round
    count, last metrics, generation, forgotten clients and bytes.

    Returns:
        The names of the files written.

    Raises:
        HistoryError: Not a run directory, or another process writes it.
        ConfigError: ``config.yaml`` differs from the store's copy.
        OutputError: A file could not be written.
    """
    run_dir = Path(run_dir)
    config = load_run_config(run_dir)
    with HistoryStore.open(store_dir(run_dir), writable=True) as store:
        rewrite_files(run_dir, config, store, "nothing was changed in the store")
    return [METRICS_FILE, SUMMARY_FILE] + ([PRIVACY_FILE] if config.privacy.enabled else [])
