"""A living run: apply an unlearning result to it, and train it further (``--continue``).

``apply_result(run_dir, result_json)`` makes the model a ``fedunlearn unlearn --out`` result
names the run's current model (``HistoryStore.apply``, one transaction; with the method's
trajectory the run's rounds are replaced by it). Before anything is written it checks the
apply file's SHA-256, the model's, the run's config fingerprint, and that the result was
computed on the run as it is now (same generation, same last round, same last model, and a
forget set holding every client forgotten before), each refusal one line. Re-running the same
apply after a crash (kill -9) finds the event committed, or not, and finishes it: the store is
then exactly as after an uninterrupted apply.

``continue_run(run_dir, to_round=T)`` trains the run to round T (``continue_run(run_dir,
rounds)``: ``rounds`` more) from the run's current model (after an apply: the applied one), with
the run's recording policy, never asking a forgotten client
(``HistoryStore.forgotten_clients``). The target round is committed before the first new round,
so re-running after a kill -9 resumes to that target and gives the uninterrupted run's models
bit for bit (every random choice derives from (seed, round, client): ``fedunlearn.runs.train``);
``--to-round T`` re-run once the run is at T does nothing (but rewrite the files derived from
the store), so it is the form to re-run blindly; ``--rounds N`` re-run after it finished adds N
more. Like ``apply``, a full disk after the store committed leaves the earlier derived files
whole and says how to finish (``rebuild_run_files``). The run's recording policy goes on: a
deferred one (Crab's windows, FedADP's stages) opens its first window at the continuation's
start round. A
DP run goes on under its mechanism at its stored clip norm and the ledger (``privacy.json``)
gains the new rounds. Once a client is forgotten, nothing a continuation decides reads its data:
the server loss (``clients_loss``), Crab's reference set and FedADP's stage start are measured
over the clients never forgotten, the DP budget schedule restarts at ε_0 at the first
continuation after the forgetting (``_budget_restart``) and a ``clip_norm: auto`` is recomputed
over the remaining clients (``_continued_clip_norm``); with nobody forgotten a continuation
equals the same run trained longer, bit for bit.

On a DP run, ``apply`` refuses a model without a DP guarantee (every method's but the DP
releases: retrain ``dp``, fedadp ``unlearn_dp``) unless ``accept_non_dp``; whether a model is
DP, and the a-priori ε its fresh rounds add, are derived from the method, its parameters and the
run (``_released_dp``, ``fedunlearn.privacy.releases``), never from the result's claim. The
ledger then records that the guarantee of the run's model ended with that generation, and keeps
the ε of DP rounds a trajectory replaced (their uploads were released):
``privacy.guarantees.living_artefacts``.

The clients that train a continuation are the run's in-process federation, or any
``RunClients`` the caller builds from it (``clients=``: the Flower ServerApp's clients over its
Grid, ``integrations/flower/server_app.py``), with the recorder it pairs with (``recorder=``);
the checks, the committed target and the sampling are the same.

``apply_model(run_dir, params, forget)`` applies a model computed elsewhere (no result file,
no trajectory): it is appended as the run's next round, like a model-only result.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from fedunlearn.config import RunConfig
from fedunlearn.errors import ConfigError, HistoryError, OutputError
from fedunlearn.fl.clients import RunClients
from fedunlearn.fl.engine import RoundObserver, run_rounds
from fedunlearn.fl.federation import Federation
from fedunlearn.fl.metrics import CLIENTS_LOSS_KEY
from fedunlearn.fl.threads import run_threads
from fedunlearn.history.digest import check_seal
from fedunlearn.history.policy import (
    DeferredPolicy,
    HistoryRecorder,
    RecordingPolicy,
    build_policy,
)
from fedunlearn.history.result_file import file_sha256, read_result_file, tensor_sha256
from fedunlearn.history.store import FILE_NAME, HistoryStore, RoundEntry
from fedunlearn.history.store.events import APPLIED_KEY
from fedunlearn.privacy.guarantees import applied_privacy
from fedunlearn.privacy.releases import DPRelease, method_release, release_epsilon
from fedunlearn.runs.components import warn_changed_components
from fedunlearn.runs.forget import APPLY_SUFFIX
from fedunlearn.runs.rundir import (
    HISTORY_DIR,
    METRICS_FILE,
    PRIVACY_FILE,
    PRIVACY_LINEAGE_KEY,
    SUMMARY_FILE,
    MetricsWriter,
    load_run_config,
    run_privacy,
    stored_clip_norm,
    stored_metrics_line,
    write_json,
    write_text_atomic,
)
from fedunlearn.runs.setup import (
    Setup,
    build_setup,
    clients_loss,
    sampler_of,
    with_recorded_executor,
)
from fedunlearn.runs.train import (
    _clients_loss_samples,
    _WallClock,
    policy_env,
    records_client_values,
    resolve_clip_norm,
    resume_state,
    training_evaluator,
    wrap_privacy,
)

__all__ = [
    "apply_model",
    "apply_result",
    "continue_run",
    "continue_target",
    "rebuild_run_files",
    "receipt_sha256",
    "run_fingerprint",
]

ClientsFactory = Callable[[Federation], RunClients]
RecorderFactory = Callable[[HistoryStore, RecordingPolicy | DeferredPolicy], RoundObserver]


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


def _store_dir(run_dir: Path) -> Path:
    if not (run_dir / HISTORY_DIR / FILE_NAME).exists():
        raise HistoryError(
            f"{run_dir} is not a run directory (no {HISTORY_DIR}/{FILE_NAME}); name the "
            "directory given to 'fedunlearn train --out'"
        )
    return run_dir / HISTORY_DIR


def _rewrite_metrics(run_dir: Path, store: HistoryStore) -> None:
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


def _load_result(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"--result {path}: not a readable result JSON ({err})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("apply"), dict):
        raise ConfigError(
            f"--result {path}: holds no apply file; write the result with 'fedunlearn unlearn "
            "--out R.json' (it saves R.apply.safetensors beside it)"
        )
    return doc


def _check_finite(model: torch.Tensor, what: str) -> None:
    """Refuse a model with NaN or infinite values (the run would serve and train from it)."""
    bad = int((~torch.isfinite(model)).sum())
    if bad:
        raise ConfigError(
            f"{what} holds {bad} NaN or infinite value(s); the run would serve it and train "
            "further rounds from it; nothing was changed"
        )


def _receipt_note(doc: dict[str, Any]) -> dict[str, Any] | None:
    """What the result's receipt says, for the apply output: influence and non-passing checks.

    The store checks are left out: they describe the store before this apply changed it.
    """
    receipt = doc.get("verification")
    if not isinstance(receipt, dict):
        return None
    flagged = [
        {"check": str(c.get("name")), "verdict": str(c.get("verdict")), "reason": c.get("reason")}
        for c in receipt.get("checks") or []
        if isinstance(c, dict)
        and c.get("verdict") in ("warn", "fail")
        and c.get("scope") != "store"  # the store before the apply, which changes it
    ]
    return {"influence": receipt.get("influence"), "flagged": flagged}


def _check_removes(result_json: Path, doc: dict[str, Any]) -> None:
    """Refuse a result that removed nobody's influence (applying it records a deletion).

    An applied forget set counts as removed from then on: its clients leave the federation and
    a later request naming them has nothing new to forget. So the no-unlearning control
    (``none``: the run's model unchanged) and a result whose own receipt says the influence
    remains are refused; ``apply --model FILE --forget IDS`` applies a model knowingly.
    """
    method = str(doc.get("method", ""))
    receipt = doc.get("verification")
    if method == "none":
        why = "it is the no-unlearning control (the run's model unchanged): it removes no client"
    elif isinstance(receipt, dict) and receipt.get("influence") == "remains":
        why = f"its receipt says the forgotten clients' influence remains ({method})"
    else:
        return
    raise ConfigError(
        f"--result {result_json}: {why}; applying it would record the request as served. "
        "Unlearn with another method (retrain always removes), or apply a model knowingly with "
        "'fedunlearn apply RUN --model FILE --forget IDS'; nothing was changed"
    )


def _released_dp(
    doc: Mapping[str, Any], config: RunConfig, store: HistoryStore, forget: set[int]
) -> tuple[bool, str, float | None]:
    """Whether a result's model is DP, why, and the a-priori ε of the releases it added.

    Derived from the method, its parameters and the run as the store recorded it
    (``fedunlearn.privacy.releases``), never from the result's ``released_model_dp`` nor its
    ``fresh_guarantee_epsilon``: a hand-edited, re-sealed result claims what it likes (issue 40).
    """
    method = str(doc.get("method", "unknown"))
    raw_params = doc.get("params")
    params = raw_params if isinstance(raw_params, dict) else {}
    release = method_release(method, params, config)
    if release is None:
        return (
            False,
            (
                f"{method} with these parameters trains its fresh updates without the run's DP "
                "mechanism (derived from the method and its parameters, not the result's claim)"
            ),
            None,
        )
    fresh = release_epsilon(
        config,
        release,
        sizes=_remaining_sizes(doc, store, forget),
        rounds=_release_rounds(release, store, forget),
        clip_norm=None if config.privacy.clip_norm == "auto" else float(config.privacy.clip_norm),
    )
    if fresh is None:
        return (
            False,
            (
                f"{method}'s a-priori ε cannot be recomputed from the run (noise_mode "
                "paper_literal with clip_norm auto: its S is not stored); not counted as DP"
            ),
            None,
        )
    return True, release.reason, fresh


def _remaining_sizes(
    doc: Mapping[str, Any], store: HistoryStore, forget: set[int]
) -> dict[int, int]:
    """The sample counts of the clients a result trained: every deleted sample left out."""
    sizes = store.run_meta.sizes()
    deleted = {c: len(ids) for c, ids in store.forgotten_samples().items()}
    raw_request = doc.get("request")
    request = raw_request if isinstance(raw_request, dict) else {}
    for c, ids in (request.get("samples") or {}).items():
        deleted[int(c)] = deleted.get(int(c), 0) + len(ids)
    return {c: n - deleted.get(c, 0) for c, n in sizes.items() if c not in forget}


def _release_rounds(release: DPRelease, store: HistoryStore, forget: set[int]) -> int:
    """How many fresh rounds a release can train: every round, or those a replay can read."""
    last = store.last_round() or 0
    if release.rounds == "run":
        return last
    return sum(
        1
        for t in range(1, last + 1)
        if any(r.stored and r.client_id not in forget for r in store.client_records(t))
    )


def _dp_gate(
    config: RunConfig,
    store: HistoryStore,
    *,
    method: str,
    trajectory: Sequence[RoundEntry] | None,
    dp: bool,
    reason: str,
    fresh_epsilon: float | None,
    accept_non_dp: bool,
    what: str,
) -> dict[str, Any] | None:
    """On a DP run: refuse a model without a DP guarantee unless accepted; the ledger entry.

    ``train_and_store``: the run's model is DP, so any model that is not is refused unless
    accepted. ``store_only``: only the stored copies are DP (training used the clean uploads),
    so only a trajectory that is not DP is refused (it would put noise-free updates in the
    store); a model alone changes no guarantee the run had.

    Returns the store meta to merge in the apply's transaction (None on a run without DP):
    the result applied, and the ledger scalars of the DP rounds a trajectory replaces (their
    releases happened: they stay in the ledger's totals). A round the trajectory carries over
    unchanged (Crab's kept prefix: the same ``dp_*`` scalars) is not a replaced one: its row
    stays the stored round's, counted once.
    """
    cfg = config.privacy
    if not cfg.enabled:
        return None
    kind = "model" if trajectory is None else "trajectory"
    store_only = cfg.dp_scope == "store_only"
    if not dp and not accept_non_dp and (kind == "trajectory" or not store_only):
        ends = (
            "its trajectory would put noise-free updates into the store, whose copies are DP "
            "(dp_scope store_only)"
            if store_only
            else "applying it ends the DP guarantee of the run's model, of every round trained "
            "from it and, with a trajectory, of the stored history"
        )
        raise ConfigError(
            f"{what}: this run is trained with DP ({cfg.mechanism}) and the model is not DP "
            f"({reason}); {ends}. Use a DP release (retrain with dp=true, or fedadp with "
            "unlearn_dp: true), or pass "
            "--accept-non-dp (accept_non_dp=True) to apply it and record that the guarantee "
            "ended; nothing was changed"
        )
    lineage = dict(store.run_meta.privacy_lineage or {})
    generation = store.generation() + 1
    last = store.last_round() or 0
    replaced = list(lineage.get("replaced", []))
    if trajectory is not None:
        carried = {
            entry.round: {k: v for k, v in entry.scalars.items() if k.startswith("dp_")}
            for entry in trajectory
        }
        for r in range(1, last + 1):
            scalars = store.round_scalars(r)
            dp_part = {k: v for k, v in scalars.items() if k.startswith("dp_")}
            if "dp_epsilon" in dp_part and carried.get(r) != dp_part:
                replaced.append({"round": r, "replaced_by_generation": generation, **dp_part})
    applied = [
        *lineage.get("applied", []),
        applied_privacy(
            generation=generation,
            method=method,
            kind=kind,
            released_model_dp=dp,
            reason=reason,
            fresh_epsilon=fresh_epsilon if dp else None,
            round_=last + 1 if trajectory is None else len(trajectory),
        ),
    ]
    return {PRIVACY_LINEAGE_KEY: {"replaced": replaced, "applied": applied}}


def _rewrite_privacy(run_dir: Path, config: RunConfig, store: HistoryStore) -> None:
    """Rewrite ``privacy.json`` for the run as it is now (after an apply or a continuation)."""
    if config.privacy.enabled:
        write_json(run_dir / PRIVACY_FILE, run_privacy(config, store))


def _rewrite_files(run_dir: Path, config: RunConfig, store: HistoryStore, done: str) -> None:
    """Rewrite the files derived from the store: ``metrics.jsonl``, ``summary.json``, privacy.

    Each is written atomically, so a full disk leaves the previous file whole; the store (the
    authority) is committed before, so the error says what was done and how to finish.

    Raises:
        OutputError: A file could not be written (naming it, what was committed and what to do).
    """
    try:
        _rewrite_metrics(run_dir, store)
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
    with HistoryStore.open(_store_dir(run_dir), writable=True) as store:
        _rewrite_files(run_dir, config, store, "nothing was changed in the store")
    return [METRICS_FILE, SUMMARY_FILE] + ([PRIVACY_FILE] if config.privacy.enabled else [])


def apply_result(
    run_dir: str | Path, result_json: str | Path, *, accept_non_dp: bool = False
) -> dict[str, Any]:
    """Apply an unlearning result (the JSON ``fedunlearn unlearn --out`` wrote) to a run.

    On a DP run a result whose model is not DP (every method but the DP releases) is
    refused unless ``accept_non_dp``; the privacy ledger then records that the guarantee of
    the run's model ended with this generation (docs/privacy.md, "A living DP run").

    Args:
        run_dir: The run directory the result was computed on.
        result_json: The result JSON; its apply file lies beside it.
        accept_non_dp: On a DP run, apply a model without a DP guarantee.

    Returns:
        The event as a dict, plus ``already_applied`` (True when this very result was
        applied before: a re-run after a crash) and ``receipt`` (the result's influence verdict
        and its checks that warn or fail; None without a receipt).

    Raises:
        ConfigError: The result holds no apply file, a digest does not match, or the result
            was computed on another run or another state of this one; nothing was changed.
        HistoryError: Not a run directory, or another process writes it.
    """
    run_dir, result_json = Path(run_dir), Path(result_json)
    doc = _load_result(result_json)
    check_seal(doc, f"--result {result_json}")  # before anything it says is believed
    spec, run, request = doc["apply"], doc.get("run") or {}, doc.get("request") or {}
    if spec.get("file") is None:
        raise ConfigError(
            f"--result {result_json} was written with --no-apply-file: there is no apply file "
            f"({result_json.with_name(result_json.stem + APPLY_SUFFIX)}) to apply; unlearn again "
            "without --no-apply-file; nothing was changed"
        )
    _check_removes(result_json, doc)
    file = result_json.parent / spec["file"]
    if not file.is_file():
        done = _applied_before(run_dir, spec.get("sha256"), doc)
        if done is not None:
            return done  # applied, and the apply file consumed: nothing left to do
        raise ConfigError(f"--result {result_json}: its apply file {file} is missing")
    digest = file_sha256(file)
    if digest != spec.get("sha256"):
        raise ConfigError(
            f"{file}: SHA-256 {digest[:12]}... does not match {spec.get('sha256', '')[:12]}... "
            f"named in {result_json}: the file was changed or replaced; nothing was changed"
        )
    config = load_run_config(run_dir)
    with HistoryStore.open(_store_dir(run_dir), writable=True) as store:
        generation, last = store.generation(), store.last_round()
        assert last is not None  # a store holds round 0 (M_0) from its creation
        events = store.events()
        again = events and events[-1].result_sha256 == digest
        if again and run.get("generation") == generation - 1:
            # a re-run after a crash or a full disk: finish what is left
            _rewrite_files(run_dir, config, store, f"generation {generation} was applied before")
            file.unlink(missing_ok=True)
            return {**events[-1].to_dict(), "already_applied": True, "receipt": _receipt_note(doc)}
        expected = run_fingerprint(config, run.get("generation", 0), run.get("last_round"))
        if run.get("fingerprint") != expected:
            raise ConfigError(
                f"--result {result_json} was computed on another run (config fingerprint "
                f"differs from {run_dir}'s); nothing was changed"
            )
        if run.get("generation") != generation or run.get("last_round") != last:
            raise ConfigError(
                f"--result {result_json} was computed on generation {run.get('generation')} at "
                f"round {run.get('last_round')}; {run_dir} is at generation {generation}, round "
                f"{last} now; unlearn again on the run as it is; nothing was changed"
            )
        if tensor_sha256(store.read_model(last)) != run.get("model_sha256"):
            raise ConfigError(
                f"--result {result_json}: the run's last model is not the one the result was "
                "computed from; unlearn again; nothing was changed"
            )
        forget = {int(c) for c in request.get("forget", [])}
        missing = sorted(store.forgotten_clients() - forget)
        if missing:
            raise ConfigError(
                f"--result {result_json} does not forget client(s) {missing}, forgotten earlier "
                "in this run; unlearn again (requests forget every earlier client); nothing was "
                "changed"
            )
        content = read_result_file(file)
        model = content.params
        if tensor_sha256(model) != spec.get("model_sha256"):
            raise ConfigError(f"{file}: the model's SHA-256 does not match {result_json}")
        _check_finite(model, f"{file}: the model")
        trajectory = content.trajectory
        if trajectory is not None and not forget <= set(trajectory.forgotten):
            raise ConfigError(
                f"{file}: the trajectory was computed without {sorted(trajectory.forgotten)}, "
                f"not the request's {sorted(forget)}; nothing was changed"
            )
        dp, why, fresh = _released_dp(doc, config, store, forget)
        privacy_meta = _dp_gate(
            config,
            store,
            method=str(doc.get("method", "unknown")),
            trajectory=None if trajectory is None else trajectory.rounds,
            dp=dp,
            reason=why,
            fresh_epsilon=fresh,
            accept_non_dp=accept_non_dp,
            what=f"--result {result_json}",
        )
        event = store.apply(
            forget=forget,
            new=request.get("new", sorted(forget)),
            method=str(doc.get("method", "unknown")),
            request_kind=str(request.get("kind", "forget")),
            model=model,
            model_sha256=spec["model_sha256"],
            trajectory=None if trajectory is None else trajectory.rounds,
            result_sha256=digest,
            receipt_sha256=receipt_sha256(doc.get("verification")),
            expected_last_round=last,
            scalars={k: doc[k] for k in ("test_accuracy", "backdoor_asr") if k in doc},
            meta=privacy_meta,
            kept=0 if trajectory is None else trajectory.kept,
            samples={int(c): ids for c, ids in (request.get("samples") or {}).items()},
        )
        _rewrite_files(run_dir, config, store, f"generation {event.generation} was applied")
    # The apply file is a copy of the trajectory: every remaining client's update of every
    # round. The store now holds them, where a later forget() erases them with a deletion
    # record and a page scan; a copy left beside R.json would keep a later-forgotten client's
    # updates (docs/lifecycle.md, "Apply"). So apply consumes it.
    file.unlink(missing_ok=True)
    return {
        **event.to_dict(),
        "already_applied": False,
        "apply_file_deleted": str(file),
        "receipt": _receipt_note(doc),
        "kept_rounds": 0 if trajectory is None else trajectory.kept,
        "samples": dict(request.get("samples") or {}),
    }


def _applied_before(
    run_dir: Path, digest: str | None, doc: dict[str, Any]
) -> dict[str, Any] | None:
    """The last event, if it applied the result whose apply file had ``digest``; else None."""
    if not digest:
        return None
    with HistoryStore.open(_store_dir(run_dir), writable=True) as store:
        events = store.events()
        if not events or events[-1].result_sha256 != digest:
            return None
        done = f"generation {events[-1].generation} was applied before"
        _rewrite_files(run_dir, load_run_config(run_dir), store, done)
        return {**events[-1].to_dict(), "already_applied": True, "receipt": _receipt_note(doc)}


def apply_model(
    run_dir: str | Path,
    params: torch.Tensor,
    forget: Sequence[int],
    *,
    method: str = "external",
    kind: str = "forget",
    accept_non_dp: bool = False,
) -> dict[str, Any]:
    """Apply a model computed elsewhere (no trajectory): appended as the run's next round.

    For a model from outside the toolkit, or a method that returns no trajectory. The forget
    set is the request's; every client forgotten earlier is added to it (cumulative). On a DP
    run such a model has no known guarantee: refused unless ``accept_non_dp``.

    Args:
        run_dir: The run directory.
        params: The model's flat float32 parameters (the run's architecture).
        forget: The clients the model is meant to have forgotten (at least one new one).
        method: What computed it (recorded in the event).
        kind: ``forget`` or ``recover``.
        accept_non_dp: On a DP run, apply it and record that the guarantee ended.

    Raises:
        ConfigError: Wrong parameter count, no client, an unknown client, nothing new, or a
            DP run without ``accept_non_dp``.
        HistoryError: Not a run directory, or another process writes it.
    """
    run_dir = Path(run_dir)
    named = {int(c) for c in forget}
    config = load_run_config(run_dir)
    with HistoryStore.open(_store_dir(run_dir), writable=True) as store:
        last = store.last_round() or 0
        current = store.read_model(last)
        if params.ndim != 1 or params.numel() != current.numel():
            raise ConfigError(
                f"the model has {params.numel()} parameters in shape {tuple(params.shape)}; "
                f"{run_dir}'s model has {current.numel()} (a flat vector); nothing was changed"
            )
        _check_finite(params, "the model")
        known = store.run_meta.client_ids
        unknown = sorted(named - known) if known else []
        if not named or unknown:
            raise ConfigError(
                f"--forget must name clients of this run (client ids {sorted(known)}); got "
                f"{sorted(named)}; nothing was changed"
            )
        applied = store.applied_clients()
        if named <= applied:
            raise ConfigError(
                f"client(s) {sorted(named)} were forgotten by an applied result earlier "
                "(nothing new to forget); nothing was changed"
            )
        full = named | store.forgotten_clients()
        model = params.detach().to(torch.float32).cpu()
        privacy_meta = _dp_gate(
            config,
            store,
            method=method,
            trajectory=None,
            dp=False,
            reason="a model made elsewhere: its privacy is not known",
            fresh_epsilon=None,
            accept_non_dp=accept_non_dp,
            what="--model",
        )
        event = store.apply(
            forget=full,
            new=full - applied,
            method=method,
            request_kind=kind,
            model=model,
            model_sha256=tensor_sha256(model),
            expected_last_round=last,
            meta=privacy_meta,
        )
        _rewrite_files(run_dir, config, store, f"generation {event.generation} was applied")
    return {**event.to_dict(), "already_applied": False}


def _pending(store: HistoryStore) -> dict[str, int] | None:
    """The recorded continuation that has not reached its target, or None."""
    cont = store.run_meta.continuation
    if cont and cont.target > (store.last_round() or 0):
        return cont.to_dict()
    return None


#: Store meta key of the budget schedule's restart point (see ``_budget_restart``).
BUDGET_RESTART_KEY = "budget_restart"


def _budget_restart(
    store: HistoryStore,
    forgotten: frozenset[int],
    start: int,
    first: Mapping[str, float],
) -> dict[str, Any] | None:
    """Where the DP budget schedule restarts, so no forgotten client's data chooses ε_t.

    The schedule (Eq. 4) chains the server loss of every round; rounds trained before a client
    was forgotten measured it on that client's data too, and a round an apply put in has none.
    So once a client is forgotten, a continuation restarts the schedule at its start round s:
    round s + 1 runs at ε_0 and Eq. 4 follows the losses measured since, over the clients never
    forgotten. Recorded in the store with the forgotten set; a later continuation with the same
    set reads the same chain (a run continued twice equals one continued once, and a re-run
    after a kill resumes it). None when nobody was forgotten: the chain goes on from round 0.
    """
    if not forgotten or CLIENTS_LOSS_KEY not in first:
        return None
    recorded = store.run_meta.budget_restart
    if recorded and recorded.get("forgotten") == sorted(forgotten):
        return dict(recorded)
    return {"round": start, "forgotten": sorted(forgotten), "loss": first[CLIENTS_LOSS_KEY]}


def _continued_clip_norm(
    config: RunConfig, setup: Setup, store: HistoryStore, remaining: Sequence[int]
) -> float | None:
    """The clip norm of continued DP rounds (None without DP: ``wrap_privacy`` ignores it).

    The stored one while nobody was forgotten (a continuation equals the run trained longer);
    an ``auto`` one recomputed at M_0 over the remaining clients and data once a client or a
    sample was forgotten, so no forgotten data chooses it (``resolve_clip_norm``).
    """
    cfg = config.privacy
    if not cfg.enabled:
        return None
    forgotten = store.forgotten_clients() or store.forgotten_samples()
    if cfg.clip_norm != "auto" or not forgotten:
        return stored_clip_norm(store)
    return resolve_clip_norm(
        cfg, setup.federation, setup.aggregator, store.read_model(0), remaining
    )


def _without_forgotten_samples(setup: Setup, store: HistoryStore) -> Setup:
    """Return ``setup`` training on the data without the samples applied results deleted."""
    gone = store.forgotten_samples()
    if not gone:
        return setup
    reduced = setup.federation.without_samples(gone)
    setup.federation.close()
    return replace(setup, federation=reduced)


def continue_target(run_dir: str | Path, rounds: int | None, *, to_round: int | None = None) -> int:
    """Return the round ``continue_run(run_dir, rounds, to_round=...)`` trains to (0 if unknown)."""
    try:
        with HistoryStore.open(_store_dir(Path(run_dir))) as store:
            pending = _pending(store)
            if pending:
                return pending["target"]
            return to_round if to_round is not None else (store.last_round() or 0) + (rounds or 0)
    except HistoryError:
        return 0


def _continuation(
    run_dir: Path,
    store: HistoryStore,
    config: RunConfig,
    rounds: int | None,
    to_round: int | None,
) -> tuple[int, int, int | None]:
    """Resolve a continuation request: ``(target, start, resumed_from_round)``.

    A recorded (committed) continuation that has not reached its target is resumed; otherwise
    ``to_round`` or ``last + rounds`` is the target. ``target == start`` (the run is at
    ``to_round`` already) means nothing to train.
    """
    last = store.last_round() or 0
    pending = _pending(store)
    if pending is not None:
        if (rounds is not None and rounds != pending["rounds"]) or (
            to_round is not None and to_round != pending["target"]
        ):
            raise ConfigError(
                f"{run_dir}: an interrupted --continue of {pending['rounds']} rounds (to "
                f"round {pending['target']}) is recorded; re-run it with --to-round "
                f"{pending['target']} (or --rounds {pending['rounds']}, or neither) to finish it "
                "first; nothing was changed"
            )
        return pending["target"], pending["from"], last
    wanted = store.run_meta.planned_rounds(config.training.rounds)
    if last != wanted:
        raise ConfigError(
            f"{run_dir} finished {last} of {wanted} rounds; complete it with "
            f"'fedunlearn train {run_dir / 'config.yaml'} --out {run_dir} --resume' "
            "before continuing"
        )
    if to_round is not None:
        if to_round < last:
            raise ConfigError(
                f"{run_dir} is at round {last}, past --to-round {to_round}; nothing was changed"
            )
        return to_round, last, None
    if rounds is None:
        raise ConfigError(
            f"{run_dir}: nothing to finish; give --to-round T (or --rounds N) to continue"
        )
    return last + rounds, last, None


def continue_run(
    run_dir: str | Path,
    rounds: int | None = None,
    *,
    to_round: int | None = None,
    observers: Sequence[RoundObserver] = (),
    clients: ClientsFactory | None = None,
    recorder: RecorderFactory = HistoryRecorder,
) -> dict[str, Any]:
    """Train the run further from its current model, with history recording.

    ``to_round`` is safe to re-run: it trains to that round, resumes an interrupted
    continuation to it, and once the run is there does nothing but rewrite the files derived
    from the store (``already_done``). ``rounds`` adds rounds to the run as it is now: re-run
    after it finished, it adds them again (while unfinished, it resumes).

    Args:
        run_dir: A finished (or applied) run directory.
        rounds: How many rounds to add (>= 1); None with ``to_round`` None finishes an
            interrupted continuation.
        to_round: The round to train to (>= the run's last round).
        observers: Extra round observers (e.g. a progress bar).
        clients: Builds the clients that train from the run's federation (default: the
            federation itself, in-process); a forgotten client is never sampled either way.
        recorder: Builds the observer that records each round into the store from the store
            and the run's recording policy (default ``HistoryRecorder``).

    Returns:
        ``{"from_round", "target", "resumed_from_round", "forgotten_clients",
        "final_metrics", "wall_seconds", "already_done"}``.

    Raises:
        ConfigError: ``rounds`` < 1, both ``rounds`` and ``to_round``, ``to_round`` behind the
            run, an interrupted continuation to another target is recorded, or the run is
            unfinished.
        HistoryError: Not a run directory, or another process writes it.
    """
    started = time.perf_counter()
    run_dir = Path(run_dir)
    if rounds is not None and to_round is not None:
        raise ConfigError("give --rounds N (rounds to add) or --to-round T, not both")
    if rounds is not None and rounds < 1:
        raise ConfigError(f"--rounds must be >= 1; got {rounds}")
    if to_round is not None and to_round < 1:
        raise ConfigError(f"--to-round must be >= 1; got {to_round}")
    config = load_run_config(run_dir)
    with HistoryStore.open(_store_dir(run_dir), writable=True) as store:
        target, start, resumed = _continuation(run_dir, store, config, rounds, to_round)
        last = store.last_round() or 0
        pending = _pending(store)
        if target == last:  # at the target already: a re-run after it finished
            _rewrite_files(run_dir, config, store, f"{run_dir} is at round {target}")
            return {
                "from_round": last,
                "target": target,
                "resumed_from_round": None,
                "forgotten_clients": sorted(store.forgotten_clients()),
                "final_metrics": store.round_scalars(target),
                "wall_seconds": time.perf_counter() - started,
                "already_done": True,
            }
        forgotten = store.forgotten_clients()
        with run_threads(store.run_meta.torch_threads, purpose="the continuation"):
            pinned = with_recorded_executor(config, store.run_meta.executor)
            setup = _without_forgotten_samples(build_setup(pinned), store)
            # the continued rounds must train on what the run trained on (as a session warns)
            warn_changed_components(store.run_meta.components, setup.components, str(run_dir))
            remaining = [c for c in setup.federation.client_ids if c not in forgotten]
            private = setup
            try:
                # DP: the run's mechanism at its clip norm; an 'auto' one is recomputed over
                # the remaining clients once one was forgotten (the stored one read its data).
                # After an applied trajectory round numbers repeat (L < T): the generation's
                # own noise and batches, never the draws an earlier upload of that round used
                privacy, private = wrap_privacy(
                    config,
                    setup,
                    _continued_clip_norm(config, setup, store, remaining),
                    noise_salt=store.generation(),
                )
                samples = _clients_loss_samples(config, privacy)
                first = (
                    {}
                    if samples is None
                    else {
                        CLIENTS_LOSS_KEY: clients_loss(
                            private, store.read_model(start), samples, remaining
                        )
                    }
                )
                restart = _budget_restart(store, forgotten, start, first)
                env = replace(
                    policy_env(private, privacy, remaining),
                    final_round=target,
                    first_round=start,
                    first_scalars=first,
                )
                policy = build_policy(config.history, env)
                if pending is None:  # the target first: a re-run after a kill finds it
                    store.update_meta(
                        {
                            "continuation": {
                                "from": start,
                                "rounds": target - start,
                                "target": target,
                            },
                            "rounds_target": target,
                            **({BUDGET_RESTART_KEY: restart} if restart else {}),
                        }
                    )
                # a deferred policy re-runs the rounds after the last window it closed since
                # the continuation's start (bit-identical)
                last = resume_state(
                    store,
                    policy,
                    privacy,
                    last,
                    None if restart is None else (restart["round"], restart["loss"]),
                )
                _rewrite_metrics(run_dir, store)
                clock = _WallClock(store, started)
                trainers = private.federation if clients is None else clients(private.federation)
                sharding = private.sharding()
                record = recorder(store, policy)
                if isinstance(record, HistoryRecorder):
                    record.client_values = records_client_values(config)
                run_rounds(
                    trainers,
                    private.aggregator,
                    store.read_model(last),
                    num_rounds=target,
                    start_round=last + 1,
                    client_ids=remaining,
                    participation=config.training.participation,
                    sampler=sampler_of(config),  # frozen K: never recomputed from who remains
                    sharding=sharding,
                    shard_params=None
                    if sharding is None
                    else {s: store.read_shard_model(last, s) for s in sharding.plan.shards},
                    join_rounds=private.join_rounds,
                    evaluate=training_evaluator(config, private, privacy, remaining),
                    observers=[
                        record,
                        clock,
                        MetricsWriter(run_dir / METRICS_FILE),
                        *([privacy] if privacy is not None else []),
                        *observers,
                    ],
                )
                done = f"rounds {start + 1}..{target} were trained"
                _rewrite_files(run_dir, config, store, done)
            finally:
                if private is not setup:
                    private.close()
                setup.close()
        return {
            "from_round": start,
            "target": target,
            "resumed_from_round": resumed,
            "forgotten_clients": sorted(forgotten),
            "final_metrics": store.round_scalars(target),
            "wall_seconds": time.perf_counter() - started,
            "already_done": False,
        }
