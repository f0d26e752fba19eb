"""A run directory's files, what can be read back from them, and their consistency checks.

A run directory holds ``history/`` (the store: M_0, every round's global model and aggregate,
the client updates the policy keeps, every client's outcome, the round metrics and, in its
metadata, the resolved config the run was trained with), ``config.yaml`` (that config, for
people and for ``train --resume``), ``metrics.jsonl`` (one line per round, regenerated from the
store on resume), ``summary.json`` (written when training finishes) and, with DP,
``privacy.json``. The store is authoritative: ``config.yaml`` must equal its copy, and every
reader here checks that (``load_run_config``, ``run_info``, ``check_run``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedunlearn.atomic import write_bytes_atomic
from fedunlearn.config import RunConfig, dump_config, load_config, parse_config
from fedunlearn.errors import ConfigError, HistoryCorruptError, HistoryError, UnknownNameError
from fedunlearn.fl.records import RoundRecord, UpdateStatus
from fedunlearn.history.store import FILE_NAME, HistoryStore
from fedunlearn.privacy.ledger import privacy_summary
from fedunlearn.runs.assembly import resolve_config
from fedunlearn.runs.plan import deletion_readiness

__all__ = [
    "CACHE_DIRS",
    "DERIVED_CACHE_DIR",
    "REFERENCES_CACHE_DIR",
    "CONFIG_FILE",
    "HISTORY_DIR",
    "METRICS_FILE",
    "PRIVACY_FILE",
    "PRIVACY_LINEAGE_KEY",
    "QUICK_CHECK_ABOVE_BYTES",
    "SUMMARY_FILE",
    "MetricsWriter",
    "check_run",
    "config_differences",
    "headline_privacy",
    "holds_run",
    "load_run_config",
    "metrics_line",
    "restore_config",
    "run_info",
    "run_privacy",
    "stored_clip_norm",
    "stored_config",
    "stored_metrics_line",
    "write_bytes_atomic",
    "write_json",
    "write_text_atomic",
]

HISTORY_DIR = "history"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
PRIVACY_FILE = "privacy.json"
CONFIG_FILE = "config.yaml"
#: Caches of what a request derives from the run (kept for the next request on the same
#: history): the receipt's shared reference models (``eval.mia.shared_references``) and the
#: methods' derived selections (``unlearn.derived_cache``). Not the run's content: ``forget``
#: deletes them, since they were computed with the forgotten clients' data.
REFERENCES_CACHE_DIR = "receipt_references"
DERIVED_CACHE_DIR = "derived"
CACHE_DIRS = (REFERENCES_CACHE_DIR, DERIVED_CACHE_DIR)
# run_info reads every payload's checksum up to this store size, only the models above it
# (a full check reads the whole file: ~1-2 s per GB from the page cache, more from disk).
QUICK_CHECK_ABOVE_BYTES = 512 * 2**20


#: Store meta key of a DP run's living-run ledger: the ledger scalars of rounds an applied
#: trajectory replaced (``replaced``) and the results applied (``applied``); written by
#: ``fedunlearn.runs.dp_gate`` in the apply's transaction.
PRIVACY_LINEAGE_KEY = "privacy_lineage"


def stored_clip_norm(store: HistoryStore) -> float | None:
    """The clip norm the run's DP rounds used (a ledger row's ``dp_clip_norm``), or None.

    Read from the stored rounds, else from the rows of rounds an applied trajectory replaced
    (``PRIVACY_LINEAGE_KEY``): on a living run round 1 may be a method's, without one.
    """
    for r in range(1, (store.last_round() or 0) + 1):
        value = store.round_scalars(r).get("dp_clip_norm")
        if value is not None:
            return float(value)
    for row in (store.run_meta.privacy_lineage or {}).get("replaced", []):
        if row.get("dp_clip_norm") is not None:
            return float(row["dp_clip_norm"])
    return None


def run_privacy(config: RunConfig, store: HistoryStore) -> dict[str, Any]:
    """Return the run's privacy ledger summary from its stored round scalars.

    On a living run it also counts the DP rounds an applied trajectory replaced and states
    what the applied results did to each artefact's guarantee (``PRIVACY_LINEAGE_KEY``).
    """
    last = store.last_round() or 0
    scalars = [store.round_scalars(r) for r in range(1, last + 1)]
    meta = store.run_meta
    lineage = meta.privacy_lineage or {}
    return privacy_summary(
        config.privacy,
        scalars,
        meta.num_params,
        replaced=lineage.get("replaced", []),
        applied=lineage.get("applied", []),
    )


def headline_privacy(ledger: Mapping[str, Any]) -> dict[str, Any]:
    """Return the privacy lines of a ``train`` / ``--continue`` summary: the guarantee first.

    ``epsilon`` is the a-priori guarantee (``epsilon_guarantee.pld_epsilon``, at
    ``neighbour_relation``); ``realised_epsilon`` beside it is the realised schedule's total,
    labelled data-dependent (docs/privacy.md).
    """
    guarantee = ledger.get("epsilon_guarantee") or {}
    return {
        "mechanism": ledger.get("mechanism"),
        "guarantee": ledger.get("guarantee"),
        "neighbour_relation": ledger.get("neighbour_relation"),
        "dp_scope": ledger.get("dp_scope"),
        "clip_norm": ledger.get("clip_norm"),
        "delta": ledger.get("delta"),
        "epsilon": guarantee.get("pld_epsilon"),
        "epsilon_basis": guarantee.get("basis"),
        "realised_epsilon": ledger.get("realised_epsilon"),
        "realised_epsilon_basis": "data-dependent: the PLD total of the ε_t the schedule chose "
        "from the noise-free server loss; not a guarantee",
    }


class MetricsWriter:
    """Round observer appending one JSON line of metrics per round."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_round_end(self, record: RoundRecord) -> None:
        """Append the round's metrics."""
        with self.path.open("a") as fh:
            fh.write(json.dumps(metrics_line(record.round, record.metrics, record)) + "\n")


def metrics_line(
    round_: int, metrics: dict[str, Any], record: RoundRecord | None = None
) -> dict[str, Any]:
    """Return the JSON-lines row of a round."""
    row: dict[str, Any] = {"round": round_, **metrics}
    if record is not None:
        row["num_accepted"] = len(record.updates)
        row["num_rejected"] = len(record.rejected)
    return row


def stored_metrics_line(store: HistoryStore, round_: int) -> dict[str, Any]:
    """Return the JSON-lines row of a committed round, as ``MetricsWriter`` wrote it."""
    statuses = [c.status for c in store.client_records(round_)]
    row = metrics_line(round_, store.round_scalars(round_))
    row["num_accepted"] = statuses.count(UpdateStatus.ACCEPTED.value)
    row["num_rejected"] = statuses.count(UpdateStatus.REJECTED.value)
    return row


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (``write_bytes_atomic`` of its UTF-8)."""
    write_bytes_atomic(path, text.encode())


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON atomically (``write_text_atomic``)."""
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")


def holds_run(run_dir: str | Path) -> bool:
    """Return whether ``run_dir`` holds a run (a config.yaml or a history store)."""
    run_dir = Path(run_dir)
    return (run_dir / CONFIG_FILE).exists() or (run_dir / HISTORY_DIR / FILE_NAME).exists()


def stored_config(store: HistoryStore) -> RunConfig | None:
    """Return the config kept in the store's metadata, or None if it holds none."""
    data = store.run_meta.config
    if data is None:
        return None
    return resolve_config(parse_config(data, f"the config stored in {store.file}"))


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): data}


def _compared(config: RunConfig) -> dict[str, Any]:
    """The config's fields that make it the run it is.

    ``privacy.budget`` is left out of a run without DP: nothing reads it there, and a run
    written before the budget's options moved to their plugin (issue 38) stored FedADP's
    defaults in it, where the same YAML read now keeps only the schedule's name.
    """
    data = config.model_dump(mode="json")
    if not config.privacy.enabled:
        data["privacy"].pop("budget", None)
    # the dump leaves training.eval_every out at its default; a difference names the value
    # (a serialization context could ask the serializer to keep it, but pydantic 2.6, the
    # declared lower bound, has none)
    data["training"].setdefault("eval_every", config.training.eval_every)
    return data


def same_run_config(a: RunConfig, b: RunConfig) -> bool:
    """Whether two configs describe the same run (``config_differences`` is then empty)."""
    return _compared(a) == _compared(b)


def config_differences(a: RunConfig, b: RunConfig, limit: int = 4) -> str:
    """Return the fields where two configs differ, as ``field: a vs b`` (empty if equal)."""
    fa, fb = _flatten(_compared(a)), _flatten(_compared(b))
    keys = [k for k in sorted(fa.keys() | fb.keys()) if fa.get(k) != fb.get(k)]
    shown = [f"{k}: {fa.get(k)!r} vs {fb.get(k)!r}" for k in keys[:limit]]
    return "; ".join(shown) + (f"; and {len(keys) - limit} more" if len(keys) > limit else "")


def _store_side_problem(run_dir: Path, store: HistoryStore) -> str | None:
    """Say how the store's metadata changed, if it fails its checksum (None: it does not).

    The metadata holds the store's copy of the config; when it fails its checksum, the copy
    cannot be trusted and ``--restore-config`` would spread it, so the message says which side
    changed: if putting config.yaml's config into the metadata gives the checksum back,
    config.yaml holds the config the run was trained with and the store's copy was edited.
    """
    changed = store.meta_problem()
    if changed is None:
        return None
    try:
        on_disk = resolve_config(load_config(run_dir / CONFIG_FILE))
        candidate = store.meta | {"config": on_disk.model_dump(mode="json")}
        yaml_is_original = store.meta_problem(candidate) is None
    except (OSError, ConfigError, UnknownNameError):
        yaml_is_original = False
    which = (
        f"the store's copy of the config was edited: {run_dir / CONFIG_FILE} holds the config "
        "the run was trained with (put into the metadata, it gives the checksum back)"
        if yaml_is_original
        else "config.yaml cannot tell which value is the original"
    )
    return (
        f"{store.file}: {changed.removeprefix('metadata: ')}; {which}. Do not run "
        "--restore-config (it would copy the changed value into config.yaml); restore "
        f"{store.file.parent} from a backup"
    )


def _config_problem(
    run_dir: Path, store: HistoryStore
) -> tuple[RunConfig | None, str | None, bool]:
    """Return the store's config, what is wrong with it or config.yaml, and which side changed.

    The third value is True when the store's side changed (its metadata fails its checksum).
    """
    store_side = _store_side_problem(run_dir, store)
    if store_side is not None:
        try:
            shown = stored_config(store)  # for display only: it cannot be trusted
        except (ConfigError, UnknownNameError):
            shown = None
        return shown, store_side, True
    stored = stored_config(store)
    path = run_dir / CONFIG_FILE
    if stored is None:
        return None, None, False
    if not path.exists():
        return (
            stored,
            (
                f"{path} is missing; the store keeps the config the run was trained with. Restore "
                f"the file with: fedunlearn verify {run_dir} --restore-config"
            ),
            False,
        )
    try:
        on_disk = resolve_config(load_config(path))
    except (ConfigError, UnknownNameError) as err:
        restore = f"Restore it with: fedunlearn verify {run_dir} --restore-config"
        return stored, f"{err}. {restore}", False
    if dump_config(on_disk) != dump_config(stored):
        return (
            stored,
            (
                f"{path} does not match the config stored in {store.file} with the run "
                f"({config_differences(on_disk, stored)}; config.yaml vs store), so config.yaml "
                "was changed after training (the store's copy matches its checksum). Restore it "
                f"with: fedunlearn verify {run_dir} --restore-config"
            ),
            False,
        )
    return stored, None, False


def _open_run(run_dir: Path) -> HistoryStore:
    if not (run_dir / HISTORY_DIR / FILE_NAME).exists():
        what = "no such directory" if not run_dir.exists() else f"no {HISTORY_DIR}/{FILE_NAME}"
        raise HistoryError(
            f"{run_dir} is not a run directory ({what}). Train one with "
            f"'fedunlearn train CONFIG --out {run_dir}'."
        )
    return HistoryStore.open(run_dir / HISTORY_DIR)


def load_run_config(run_dir: str | Path) -> RunConfig:
    """Return the config a run directory was trained with.

    Raises:
        HistoryError: ``run_dir`` holds no run.
        ConfigError: ``config.yaml`` is missing or differs from the store's copy (the message
            names the fields and how to restore it).
        HistoryCorruptError: The store's metadata (holding its copy of the config) fails its
            checksum; the message says which side changed.
    """
    run_dir = Path(run_dir)
    path = run_dir / CONFIG_FILE
    if not (run_dir / HISTORY_DIR / FILE_NAME).exists() and path.exists():
        return resolve_config(load_config(path))  # a run that failed before its store existed
    with _open_run(run_dir) as store:
        stored, problem, store_side = _config_problem(run_dir, store)
    if problem is not None:
        raise (HistoryCorruptError if store_side else ConfigError)(problem)
    return stored if stored is not None else resolve_config(load_config(path))


def restore_config(run_dir: str | Path) -> Path:
    """Rewrite ``config.yaml`` from the store's copy (atomically) and return its path.

    Raises:
        HistoryError: ``run_dir`` holds no run, or its store keeps no config.
        HistoryCorruptError: The store's metadata fails its checksum (its copy cannot be
            trusted); nothing is written.
    """
    run_dir = Path(run_dir)
    with _open_run(run_dir) as store:
        store_side = _store_side_problem(run_dir, store)
        if store_side is not None:
            raise HistoryCorruptError(f"{store_side}; config.yaml was not rewritten")
        stored = stored_config(store)
    if stored is None:
        raise HistoryError(f"{run_dir}: the store keeps no config to restore config.yaml from.")
    write_text_atomic(run_dir / CONFIG_FILE, dump_config(stored))
    return run_dir / CONFIG_FILE


def _derived_file_problems(run_dir: Path, store: HistoryStore) -> list[str]:
    """What is wrong with the files derived from the store (summary.json, metrics.jsonl).

    Checked on a run that reached its target (an interrupted one writes them when it ends):
    ``summary.json`` must exist, parse and name the store's last round and generation;
    ``metrics.jsonl`` must hold a line for every round 1..last and none after. Both are
    rebuilt from the store by ``fedunlearn verify RUN --rebuild`` (``runs.rebuild_run_files``).
    """
    last = store.last_round()
    meta = store.run_meta
    target = meta.planned_rounds(meta.training.get("rounds"))
    if last is None or last != target:
        return []
    fix = f"rebuild it from the store with: fedunlearn verify {run_dir} --rebuild"
    problems = []
    path = run_dir / SUMMARY_FILE
    try:
        summary = json.loads(path.read_text())
    except FileNotFoundError:
        summary = None
        problems.append(f"{path} is missing; {fix}")
    except (OSError, ValueError) as err:
        summary = None
        problems.append(f"{path} is not readable JSON ({err}); {fix}")
    if isinstance(summary, dict):
        rounds, generation = summary.get("rounds"), summary.get("generation", 0)
        if rounds != last or generation != store.generation():
            problems.append(
                f"{path} describes round {rounds}, generation {generation}; the store is at round "
                f"{last}, generation {store.generation()} (a command stopped before rewriting "
                f"it); {fix}"
            )
    elif summary is not None:
        problems.append(f"{path} is not a JSON object; {fix}")
    path = run_dir / METRICS_FILE
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        seen: set[int] = {
            r["round"] for r in rows if isinstance(r, dict) and type(r.get("round")) is int
        }
    except (OSError, ValueError):
        problems.append(f"{path} is missing or not JSON lines; {fix}")
    else:
        if not set(range(1, last + 1)) <= seen or max(seen, default=0) != last:
            problems.append(
                f"{path} does not hold one line per round 1..{last} (its last round: "
                f"{max(seen, default=None)}); {fix}"
            )
    return problems


def check_run(run_dir: str | Path, *, full: bool = True) -> dict[str, Any]:
    """Check a run directory: the store, config.yaml against it, and the derived files.

    Args:
        run_dir: The run directory.
        full: Read every payload's checksum; False reads the catalog and the models only.

    Returns:
        ``{"ok", "store": StoreCheck dict, "config": problem or None, "config_side":
        "config.yaml" | "store" | None, "files": [...], "problems": [...],
        "first_bad_round"}``; ``problems`` lists the config problem first, then the store's,
        then the derived files' (summary.json, metrics.jsonl).
    """
    run_dir = Path(run_dir)
    with _open_run(run_dir) as store:
        _, config_problem, store_side = _config_problem(run_dir, store)
        result = store.check(full=full)
        files = _derived_file_problems(run_dir, store)
    store_problems = [
        p for p in result.problems if not (store_side and p.startswith("metadata: "))
    ]  # the config problem says it, with which side changed
    problems = ([config_problem] if config_problem else []) + store_problems + files
    return {
        "ok": not problems,
        "full": full,
        "store": result.to_dict(),
        "config": config_problem,
        "config_side": None if not config_problem else "store" if store_side else "config.yaml",
        "files": files,
        "problems": problems,
        "first_bad_round": result.first_bad_round,
    }


def run_info(run_dir: str | Path, *, full_check: bool | None = None) -> dict[str, Any]:
    """Describe a run and check it.

    What it reports: config, rounds (planned: the store's target after ``apply`` or
    ``train --continue``), the applied events (generations), stored bytes (total, per kind, per
    client), forgotten clients (erased or applied), metrics, and a check of the store and of
    config.yaml against the store's copy.

    Args:
        run_dir: The run directory.
        full_check: Read every payload's checksum (True), the models only (False), or decide
            by size (None: full up to ``QUICK_CHECK_ABOVE_BYTES``).

    Raises:
        HistoryError: ``run_dir`` holds no run.
    """
    run_dir = Path(run_dir)
    with _open_run(run_dir) as store:
        stored, config_problem, _ = _config_problem(run_dir, store)
        config = stored if stored is not None else load_config(run_dir / CONFIG_FILE)
        full = store.file_bytes() <= QUICK_CHECK_ABOVE_BYTES if full_check is None else full_check
        check = store.check(full=full)
        rounds = store.rounds()
        last = rounds[-1] if rounds else None
        forgotten: dict[int, dict[str, Any]] = {}
        for entry in store.forget_records():
            seen = forgotten.setdefault(
                entry.client_id, {"forgotten_at": entry.forgotten_at, "size_bytes": 0}
            )
            seen["size_bytes"] += entry.size_bytes
        problems = (
            ([config_problem] if config_problem else [])
            + list(check.problems)
            + _derived_file_problems(run_dir, store)
        )
        meta = store.run_meta
        target = meta.planned_rounds(config.training.rounds)
        events = [e.to_dict() for e in store.events()]
        for client in store.forgotten_clients() - set(forgotten):  # applied, not erased yet
            forgotten[client] = {"forgotten_at": None, "size_bytes": 0}
        info: dict[str, Any] = {
            "run_dir": str(run_dir),
            "dataset": config.data.dataset,
            "model": config.model.factory or config.model.name,
            "num_params": meta.num_params,
            "num_clients": config.data.num_clients,
            "rounds_planned": target,
            "rounds_completed": last or 0,
            "complete": last == target,
            "generation": len(events),
            "events": events,
            "history_policy": meta.history_policy or config.history.policy,
            "attack": config.attack.kind,
            "malicious_clients": meta.malicious,
            "forgotten_clients": sorted(forgotten),
            "forgotten": {str(c): v for c, v in sorted(forgotten.items())},
            "stored_bytes": store.stored_bytes(),
            "stored_bytes_by_kind": store.stored_bytes_by_kind(),
            "stored_bytes_by_client": {
                str(k): v for k, v in sorted(store.stored_bytes_by_client().items())
            },
            "file_bytes": store.file_bytes(),
            "wall_seconds": meta.wall_seconds,
            "torch_threads": meta.torch_threads,
            "metrics": [stored_metrics_line(store, r) for r in rounds],
            "privacy": run_privacy(config, store),
            "deletion_readiness": deletion_readiness(store, config, frozenset(forgotten)),
            "check": check.to_dict(),
            "problems": problems,
        }
        from fedunlearn.runs.app_requests import serving  # it imports this module

        info["serving"] = serving(store.meta, run_dir)
    return info


def open_meta(run_dir: str | Path) -> dict[str, Any]:
    """Return a run's store metadata (the store opened read-only).

    Raises:
        HistoryError: ``run_dir`` holds no run.
    """
    with _open_run(Path(run_dir)) as store:
        return dict(store.meta)
