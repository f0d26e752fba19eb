"""Apply an unlearning result, or a model made elsewhere, to a run (``fedunlearn apply``).

``apply_result(run_dir, result_json)`` makes the model a ``fedunlearn unlearn --out`` result
names the run's current model (``HistoryStore.apply``, one transaction; with the method's
trajectory the run's rounds are replaced by it). Before anything is written it checks the
apply file's SHA-256, the model's, the run's config fingerprint, and that the result was
computed on the run as it is now (same generation, same last round, same last model, and a
forget set holding every client forgotten before), each refusal one line. Re-running the same
apply after a crash (kill -9) finds the event committed, or not, and finishes it: the store is
then exactly as after an uninterrupted apply. Like ``--continue``, a full disk after the store
committed leaves the earlier derived files whole and says how to finish
(``fedunlearn.runs.run_files``). On a DP run the gate of ``fedunlearn.runs.dp_gate`` decides
whether the model may be applied and what the privacy ledger records.

``apply_model(run_dir, params, forget)`` applies a model computed elsewhere (no result file,
no trajectory): it is appended as the run's next round, like a model-only result.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from fedunlearn.config import RunConfig
from fedunlearn.errors import ConfigError
from fedunlearn.history.digest import check_seal
from fedunlearn.history.result_claims import ResultClaims
from fedunlearn.history.result_file import (
    ResultFile,
    file_sha256,
    read_result_file,
    tensor_sha256,
)
from fedunlearn.history.store import AppliedEvent, HistoryStore
from fedunlearn.runs.dp_gate import dp_gate, released_dp
from fedunlearn.runs.fingerprint import receipt_sha256, run_fingerprint
from fedunlearn.runs.forget import APPLY_SUFFIX
from fedunlearn.runs.run_files import rewrite_files, store_dir
from fedunlearn.runs.rundir import load_run_config

__all__ = ["apply_model", "apply_result"]


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


def _check_removes(result_json: Path, claims: ResultClaims) -> None:
    """Refuse a result that removed nobody's influence (applying it records a deletion).

    An applied forget set counts as removed from then on: its clients leave the federation and
    a later request naming them has nothing new to forget. So the no-unlearning control
    (``none``: the run's model unchanged) and a result whose own receipt says the influence
    remains are refused; ``apply --model FILE --forget IDS`` applies a model knowingly.
    """
    method = claims.method
    forged = claims.unsupported_removal() if claims.receipt else None
    if forged is not None:
        raise ConfigError(f"--result {result_json}: {forged}; nothing was changed")
    if method == "none":
        why = "it is the no-unlearning control (the run's model unchanged): it removes no client"
    elif claims.influence == "remains":
        why = f"its receipt says the forgotten clients' influence remains ({method})"
    else:
        return
    raise ConfigError(
        f"--result {result_json}: {why}; applying it would record the request as served. "
        "Unlearn with another method (retrain always removes), or apply a model knowingly with "
        "'fedunlearn apply RUN --model FILE --forget IDS'; nothing was changed"
    )


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
    claims = ResultClaims.from_doc(doc)
    file = _apply_file(result_json, spec, claims)
    if not file.is_file():
        done = _applied_before(run_dir, spec.get("sha256"), claims)
        if done is not None:
            return done  # applied, and the apply file consumed: nothing left to do
        raise ConfigError(
            f"--result {result_json}: its apply file {file} is missing (moved, or deleted by "
            "'fedunlearn forget' because it held a forgotten client's update); run the request "
            "again with 'fedunlearn unlearn' (after a forget, the new result forgets those "
            "clients too); nothing was changed"
        )
    digest = file_sha256(file)
    if digest != spec.get("sha256"):
        raise ConfigError(
            f"{file}: SHA-256 {digest[:12]}... does not match {spec.get('sha256', '')[:12]}... "
            f"named in {result_json}: the file was changed or replaced; nothing was changed"
        )
    config = load_run_config(run_dir)
    with HistoryStore.open(store_dir(run_dir), writable=True) as store:
        generation = store.generation()
        events = store.events()
        again = events and events[-1].result_sha256 == digest
        if again and run.get("generation") == generation - 1:
            # a re-run after a crash or a full disk: finish what is left
            rewrite_files(run_dir, config, store, f"generation {generation} was applied before")
            file.unlink(missing_ok=True)
            note = claims.receipt_note()
            return {**events[-1].to_dict(), "already_applied": True, "receipt": note}
        forget = {int(c) for c in request.get("forget", [])}
        _check_state(result_json, run_dir, config, store, doc, forget)
        content = _read_apply_file(file, result_json, spec, forget)
        trajectory = content.trajectory
        dp, why, fresh = released_dp(claims, request.get("samples"), config, store, forget)
        privacy_meta = dp_gate(
            config,
            store,
            method=claims.method or "unknown",
            trajectory=None if trajectory is None else trajectory.rounds,
            dp=dp,
            reason=why,
            fresh_epsilon=fresh,
            accept_non_dp=accept_non_dp,
            what=f"--result {result_json}",
        )
        event = _commit(store, doc, content, forget, digest, privacy_meta)
        rewrite_files(run_dir, config, store, f"generation {event.generation} was applied")
    # The apply file is a copy of the trajectory: every remaining client's update of every
    # round. The store now holds them, where a later forget() erases them with a deletion
    # record and a page scan; a copy left beside R.json would keep a later-forgotten client's
    # updates (docs/lifecycle.md, "Apply"). So apply consumes it.
    file.unlink(missing_ok=True)
    return {
        **event.to_dict(),
        "already_applied": False,
        "apply_file_deleted": str(file),
        "receipt": claims.receipt_note(),
        "kept_rounds": 0 if trajectory is None else trajectory.kept,
        "samples": dict(request.get("samples") or {}),
    }


def _commit(
    store: HistoryStore,
    doc: dict[str, Any],
    content: ResultFile,
    forget: set[int],
    digest: str,
    privacy_meta: dict[str, Any] | None,
) -> AppliedEvent:
    """Apply the checked result in one store transaction (``HistoryStore.apply``)."""
    spec, request, trajectory = doc["apply"], doc.get("request") or {}, content.trajectory
    return store.apply(
        forget=forget,
        new=request.get("new", sorted(forget)),
        method=str(doc.get("method", "unknown")),  # as the event records it
        request_kind=str(request.get("kind", "forget")),
        model=content.params,
        model_sha256=spec["model_sha256"],
        trajectory=None if trajectory is None else trajectory.rounds,
        result_sha256=digest,
        receipt_sha256=receipt_sha256(doc.get("verification")),
        expected_last_round=store.last_round(),
        scalars={k: doc[k] for k in ("test_accuracy", "backdoor_asr") if k in doc},
        meta=privacy_meta,
        kept=0 if trajectory is None else trajectory.kept,
        samples={int(c): ids for c, ids in (request.get("samples") or {}).items()},
    )


def _apply_file(result_json: Path, spec: dict[str, Any], claims: ResultClaims) -> Path:
    """The apply file a result names; refused when it has none, or removes nobody."""
    if spec.get("file") is None:
        raise ConfigError(
            f"--result {result_json} was written with --no-apply-file: there is no apply file "
            f"({result_json.with_name(result_json.stem + APPLY_SUFFIX)}) to apply; unlearn again "
            "without --no-apply-file; nothing was changed"
        )
    _check_removes(result_json, claims)
    return result_json.parent / str(spec["file"])


def _check_state(
    result_json: Path,
    run_dir: Path,
    config: RunConfig,
    store: HistoryStore,
    doc: dict[str, Any],
    forget: set[int],
) -> None:
    """Refuse a result computed on another run, or on another state of this one."""
    run = doc.get("run") or {}
    generation, last = store.generation(), store.last_round()
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
    if tensor_sha256(store.read_model(last or 0)) != run.get("model_sha256"):
        raise ConfigError(
            f"--result {result_json}: the run's last model is not the one the result was "
            "computed from; unlearn again; nothing was changed"
        )
    missing = sorted(store.forgotten_clients() - forget)
    if missing:
        raise ConfigError(
            f"--result {result_json} does not forget client(s) {missing}, forgotten earlier "
            "in this run; unlearn again (requests forget every earlier client); nothing was "
            "changed"
        )


def _read_apply_file(
    file: Path, result_json: Path, spec: dict[str, Any], forget: set[int]
) -> ResultFile:
    """Read the apply file: its model as the result names it, finite; its trajectory's set."""
    content = read_result_file(file)
    if tensor_sha256(content.params) != spec.get("model_sha256"):
        raise ConfigError(f"{file}: the model's SHA-256 does not match {result_json}")
    _check_finite(content.params, f"{file}: the model")
    trajectory = content.trajectory
    if trajectory is not None and not forget <= set(trajectory.forgotten):
        raise ConfigError(
            f"{file}: the trajectory was computed without {sorted(trajectory.forgotten)}, "
            f"not the request's {sorted(forget)}; nothing was changed"
        )
    return content


def _applied_before(
    run_dir: Path, digest: str | None, claims: ResultClaims
) -> dict[str, Any] | None:
    """The last event, if it applied the result whose apply file had ``digest``; else None."""
    if not digest:
        return None
    with HistoryStore.open(store_dir(run_dir), writable=True) as store:
        events = store.events()
        if not events or events[-1].result_sha256 != digest:
            return None
        done = f"generation {events[-1].generation} was applied before"
        rewrite_files(run_dir, load_run_config(run_dir), store, done)
        return {**events[-1].to_dict(), "already_applied": True, "receipt": claims.receipt_note()}


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
    with HistoryStore.open(store_dir(run_dir), writable=True) as store:
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
        privacy_meta = dp_gate(
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
        rewrite_files(run_dir, config, store, f"generation {event.generation} was applied")
    return {**event.to_dict(), "already_applied": False}
