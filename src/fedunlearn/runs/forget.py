"""Forgetting clients' stored updates from a run directory, and the evidence that they are gone.

``forget_clients`` deletes the clients' payloads from the run's history (``HistoryStore.forget``:
secure delete, space given back, a deletion record kept in the store) and the result files in
the run directory that hold their updates (``result_files_holding``). ``store_evidence`` is the
one implementation of the deletion evidence every reader uses (the receipt's ``Verifier``, this
module's ``deletion_evidence``, the ``forget`` command): the store's ``DeletionEvidence`` with the
run directory's result files and the participation check. ``deletion_evidence``
gathers, for a run and a set of clients, what a receipt needs as one JSON-ready dict: the
deletion records (rounds, sizes, SHA-256 of each deleted payload and dropped model, time, bytes
reclaimed), a fresh check that every deleted payload is unreadable and none of its pages is left
in the files, including payloads deleted outside ``forget()`` (``HistoryStore.check_deletions``),
and the updates that could still be rebuilt from what the store keeps
(``history.store.reconstruction``).

Removing the clients' influence from the last model is an unlearning method's job (``fedunlearn
unlearn``); this module erases the stored updates, and the stored aggregates and global models
that would rebuild them, as a deletion request requires (e.g. GDPR Art. 17).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fedunlearn.errors import ConfigError
from fedunlearn.history.store import DeletionRecord, HistoryStore
from fedunlearn.history.store.evidence import DeletionEvidence
from fedunlearn.runs.participation import participation_gaps
from fedunlearn.runs.run_files import store_dir
from fedunlearn.runs.rundir import CACHE_DIRS, HISTORY_DIR, load_run_config

__all__ = [
    "StoreEvidence",
    "deletion_evidence",
    "forget_clients",
    "result_files_holding",
    "store_evidence",
]

APPLY_SUFFIX = ".apply.safetensors"


def _updates_in(path: Path) -> set[tuple[int, int]]:
    """(round, client) of every update an apply file's trajectory holds (its header only)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            keys = list(fh.keys())
    except Exception:  # not readable as safetensors: not a result file of ours
        return set()
    out = set()
    for key in keys:
        head, dot, tail = key.partition(".u")
        if dot and head.startswith("r") and head[1:].isdigit() and tail.isdigit():
            out.add((int(head[1:]), int(tail)))
    return out


def result_files_holding(run_dir: str | Path, client_ids: Iterable[int]) -> list[dict[str, Any]]:
    """Return the result files in ``run_dir`` that hold updates of ``client_ids``.

    An ``unlearn --out`` inside the run directory leaves ``R.apply.safetensors`` (the method's
    model and trajectory, with every update it kept bit for bit); forgetting a client must
    delete its updates there too. Each entry: ``{"path", "size_bytes", "updates": [[round,
    client], ...]}``.
    """
    wanted = set(client_ids)
    found = []
    for path in sorted(Path(run_dir).rglob(f"*{APPLY_SUFFIX}")):
        held = sorted(p for p in _updates_in(path) if p[1] in wanted)
        if held:
            found.append(
                {
                    "path": str(path),
                    "size_bytes": path.stat().st_size,
                    "updates": [list(p) for p in held],
                }
            )
    return found


def _client_ids(client_ids: Iterable[int]) -> list[int]:
    ids = sorted(set(client_ids))
    if not ids:
        raise ConfigError("name at least one client id to forget (e.g. 3,7)")
    return ids


def forget_clients(
    run_dir: str | Path,
    client_ids: Iterable[int],
    *,
    vacuum: Literal["incremental", "full"] = "incremental",
) -> DeletionRecord:
    """Delete every stored update of ``client_ids`` from a run's history and run directory.

    Takes the run's writer lock (refused while a training or another forget writes the run).
    Refused, like ``apply`` and ``unlearn``, when ``config.yaml`` is not the run's (it differs
    from the store's copy) or the store's metadata was changed, and for an isolated-shards run
    whose clients were not applied yet. Besides the store (``HistoryStore.forget``: the updates,
    the models that rebuild them, the clients' per-round norms and inner products), it deletes
    every result file in the run directory that holds one of their updates
    (``result_files_holding``: an apply file written by ``unlearn --out`` there and never
    applied) and the run directory's caches (``rundir.CACHE_DIRS``: the receipt's shared
    reference models, some trained with the clients' data, and the methods' derived
    selections), which the next request rebuilds.

    Args:
        run_dir: The run directory.
        client_ids: Clients to forget.
        vacuum: How to give the space back (``HistoryStore.forget``).

    Returns:
        The call's deletion record (also kept in the store).

    Raises:
        HistoryError: Not a run directory, or another process writes it.
        ConfigError: ``config.yaml`` differs from the store's copy; nothing was changed.
        UnknownClientError: A client never appears in the run; nothing was changed.
    """
    ids = _client_ids(client_ids)
    load_run_config(run_dir)  # config.yaml must be this run's (as apply and unlearn require)
    with HistoryStore.open(store_dir(Path(run_dir)), writable=True) as store:
        shards = int(store.run_meta.training.get("shards") or 1)
        pending = sorted(set(ids) - store.applied_clients())
        if shards > 1 and pending:
            raise ConfigError(
                f"{run_dir} trained {shards} isolated shards, whose stored shard models would let "
                f"client(s) {pending}'s updates be rebuilt; apply a shard_retrain (or retrain) "
                "result for them first (it replaces every round that used them, leaving nothing "
                "to forget); nothing was changed"
            )
        record = store.forget(ids, vacuum=vacuum)
    for entry in result_files_holding(run_dir, ids):  # their updates, outside the store
        Path(entry["path"]).unlink(missing_ok=True)
    for cache in CACHE_DIRS:  # computed with their data (reference models, selections)
        folder = Path(run_dir) / cache
        if folder.is_symlink():
            folder.unlink()  # the link, never what it points at
        elif folder.is_dir():
            shutil.rmtree(folder)
    return record


@dataclass(frozen=True)
class StoreEvidence:
    """The deletion evidence of a run's store, with what its run directory adds.

    Attributes:
        evidence: ``HistoryStore.deletion_evidence`` with the result files in the run directory
            that still hold the clients' updates (``result_files_holding``).
        participation: The rounds where the run's seeded sampler drew one of the clients but
            its row is gone (``runs.participation.participation_gaps``).
    """

    evidence: DeletionEvidence
    participation: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The receipt's ``deletion`` evidence (what its ``deletion`` rule reads), JSON-ready."""
        return self.evidence.to_dict() | {"participation": self.participation}


def store_evidence(store: HistoryStore, client_ids: Iterable[int]) -> StoreEvidence:
    """Return the evidence that ``client_ids``' stored updates are gone: the one implementation.

    The receipt (``eval.verifier``), ``deletion_evidence`` and ``fedunlearn forget`` all read
    it. A store inside a run directory (``<run>/history``) adds the run directory's result files
    holding the clients' updates; any store, the participation check.

    Args:
        store: The history store (read-only is enough).
        client_ids: The clients the evidence is about (none: an empty account).
    """
    evidence = store.deletion_evidence(client_ids)
    if store.file.parent.name == HISTORY_DIR:
        run_dir = store.file.parent.parent
        evidence = evidence.with_result_files(result_files_holding(run_dir, evidence.clients))
    # the sampler's draws against the rows kept: rows deleted by hand with the updates
    return StoreEvidence(evidence, participation_gaps(store, evidence.clients))


def deletion_evidence(run_dir: str | Path, client_ids: Iterable[int]) -> dict[str, Any]:
    """Return the evidence that ``client_ids``' stored updates were deleted, JSON-ready.

    Opens the run read-only and checks it now: every deleted payload recorded for these
    clients must be unreadable and no page of it left in the store's files.

    Args:
        run_dir: The run directory.
        client_ids: The clients a receipt is about.

    Returns:
        ``{"run_dir", "store", "checked_at", "client_ids", "forgotten": {client: bool},
        "records": [DeletionRecord dicts, these clients' payloads only], "check":
        DeletionCheck dict, "page_scan": {"ran", "fragments_found", "inconclusive_reason"},
        "reconstructible": [[round, client], ...], "result_files", "evidence", "ok"}``
        (``evidence``: ``HistoryStore.deletion_evidence`` with the run directory's result files,
        the receipt's JSON); ``ok`` is True when every client was forgotten, the check passed
        (the catalogue's account included), no deleted update can be rebuilt from the store
        and no result file in the run directory holds one.

    Raises:
        HistoryError: Not a run directory.
    """
    run_dir = Path(run_dir)
    ids = _client_ids(client_ids)
    with HistoryStore.open(store_dir(run_dir)) as store:
        records = store.deletion_records(ids)
        logged = {entry.client_id for entry in store.forget_records()}
        found = store_evidence(store, ids)
        file = str(store.file)
    evidence, gaps = found.evidence, found.participation
    check, rebuildable = evidence.check, [list(p) for p in evidence.reconstructible]
    forgotten = {str(c): c in logged for c in ids}
    return {
        "run_dir": str(run_dir),
        "store": file,
        "checked_at": time.time(),
        "client_ids": ids,
        "forgotten": forgotten,
        "records": [r.to_dict() for r in records],
        "check": check.to_dict(),
        "page_scan": {
            "ran": True,
            "fragments_found": check.fingerprints_found,
            "inconclusive_reason": check.inconclusive_reason,
        },
        "reconstructible": rebuildable,
        "result_files": list(evidence.result_files),
        "participation": gaps,
        "evidence": found.to_dict(),  # what the receipt's deletion check reads
        "ok": all(forgotten.values())
        and check.ok
        and not rebuildable
        and not evidence.result_files
        and not gaps["missing"],
    }
