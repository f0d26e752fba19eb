"""Audit any model of a run's architecture: the same receipt an unlearning result gets.

``audit_model(run_dir, params, forget)`` opens the run, measures the model (``Verifier.audit``)
and returns the receipt document; ``read_model_file`` reads the model from a file: a
``.safetensors`` state dict (the module's parameter names, as ``safetensors.torch.save_file`` or
``save_model`` write them), or a ``.pt`` file holding the flat parameter vector
(``fedunlearn unlearn --save-model``) or a state dict. A model trained or edited outside the
toolkit is audited the same way, as long as it has the run's architecture.

Which clients the model is supposed to have forgotten: ``forget``; by default the clients the
run's store has deleted (``fedunlearn forget``), if any.

The method's warnings and the result's lineage live in the result file ``fedunlearn unlearn``
wrote (``--out R.json``): ``audit_model(..., result="R.json")`` carries them into the receipt
(``read_result_file``), after checking its integrity digest (an edited result is refused:
``history.digest``) and that it was computed on this run (its config fingerprint). Without it
the receipt says that no warnings were available and that the model has no lineage. The
receipt document is sealed the same way, bound to the run's identity (``run``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedunlearn.errors import ConfigError, IntegrityError
from fedunlearn.eval.generations import client_entries
from fedunlearn.eval.plan import ReceiptOptions
from fedunlearn.eval.verifier import lineage_from_dict
from fedunlearn.experiments.compare import RESULTS_SCHEMA_VERSION, Progress, verifying_receipts
from fedunlearn.history.digest import check_seal, seal
from fedunlearn.history.result_claims import ResultClaims
from fedunlearn.history.result_file import tensor_sha256
from fedunlearn.models.flat import get_flat_params
from fedunlearn.runs import run_fingerprint
from fedunlearn.unlearn import UnlearnRequest, UnlearnResult, UnlearnSession

__all__ = [
    "audit_model",
    "forgotten_clients",
    "read_json_file",
    "read_model_file",
    "read_result_file",
    "replay_exact",
    "replay_method",
]

MODEL_SUFFIXES = (".safetensors", ".pt", ".pth")


def _from_state_dict(state: dict[str, Any], model: nn.Module, path: Path) -> torch.Tensor:
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ConfigError(
            f"{path} does not hold this run's model: missing {missing[:4] or 'nothing'}, "
            f"unexpected {unexpected[:4] or 'nothing'} (expected keys {sorted(expected)[:6]}). "
            "Save the model of the run's architecture (its state_dict)."
        )
    for key, tensor in expected.items():
        got = state[key]
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(tensor.shape):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise ConfigError(
                f"{path}: '{key}' has shape {shape}; this run's model expects {tuple(tensor.shape)}"
            )
    clone = copy.deepcopy(model)
    clone.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()})
    return get_flat_params(clone)


def read_model_file(path: str | Path, model: nn.Module) -> torch.Tensor:
    """Return the flat parameters of the model stored in ``path``.

    Args:
        path: A ``.safetensors`` state dict, or a ``.pt``/``.pth`` file with a flat vector or a
            state dict.
        model: The run's architecture (template; not modified).

    Raises:
        ConfigError: if the file is missing, of another kind, unreadable, or not a model of this
            architecture.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"model file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix not in MODEL_SUFFIXES:
        raise ConfigError(
            f"model file {path}: unknown kind '{suffix}'; pass a {', '.join(MODEL_SUFFIXES)} file"
        )
    if suffix == ".safetensors":
        try:
            from safetensors import SafetensorError
            from safetensors.torch import load_file
        except ImportError:  # pragma: no cover - depends on the environment
            raise ConfigError(
                "reading .safetensors files needs the safetensors package: pip install safetensors"
            ) from None
        try:
            state: Any = load_file(str(path))
        except (SafetensorError, OSError) as err:
            raise ConfigError(f"{path} is not a readable safetensors file: {err}") from None
    else:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # torch raises several kinds for a bad file
            raise ConfigError(f"{path} is not a readable torch file: {err}") from None
    if isinstance(state, torch.Tensor):
        expected = sum(p.numel() for p in model.parameters())
        if state.ndim != 1 or state.numel() != expected:
            raise ConfigError(
                f"{path} holds a tensor of shape {tuple(state.shape)}; this run's model has "
                f"{expected} parameters (a flat vector, as 'fedunlearn unlearn --save-model' "
                "writes, or a state dict)"
            )
        return state.detach().to(torch.float32)
    if isinstance(state, dict):
        return _from_state_dict(state, model, path)
    raise ConfigError(
        f"{path} holds a {type(state).__name__}; expected a flat parameter tensor or a state dict"
    )


def read_json_file(path: Path, what: str, hint: str = "") -> Any:
    """Return the JSON value of the file at ``path`` (``what`` names it in errors).

    Raises:
        ConfigError: ``{what} does not exist{hint}`` if it is not a file, ``{what} is not
            readable JSON: ...`` if it cannot be read or parsed.
    """
    if not path.is_file():
        raise ConfigError(f"{what} does not exist{hint}")
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{what} is not readable JSON: {err}") from None


def read_result_file(path: str | Path) -> dict[str, Any]:
    """Return the result JSON ``fedunlearn unlearn --out`` wrote.

    Raises:
        ConfigError: if the file is missing, not JSON, or not a result of ``unlearn``.
    """
    path = Path(path)
    doc = read_json_file(path, f"result file {path}")
    if not isinstance(doc, dict) or "method" not in doc or "request" not in doc:
        raise ConfigError(
            f"{path} is not a result of 'fedunlearn unlearn' (no 'method' and 'request'); pass "
            "the file its --out wrote"
        )
    check_seal(doc, f"--result {path}")  # an edited result's claims are not carried over
    return doc


def _check_same_run(result: Mapping[str, Any], session: UnlearnSession, source: str) -> None:
    """Refuse a result computed on another run (its config fingerprint is not this run's)."""
    run = result.get("run")
    if not isinstance(run, Mapping):
        return  # a document without a run identity (the Python API's own summaries)
    expected = run_fingerprint(
        session.run_view.config, run.get("generation", 0), run.get("last_round")
    )
    if run.get("fingerprint") != expected:
        raise IntegrityError(
            f"{source} was computed on another run (its config fingerprint differs from "
            f"{session.run_view.run_dir}'s); pass the result of this run"
        )


def _result_claims(
    result: Mapping[str, Any], request: UnlearnRequest, source: str
) -> tuple[list[str], Any, str, list[str]]:
    """Return the warnings, lineage, method and assumptions a result carries for ``request``."""
    req = result.get("request") or {}
    forget = sorted(int(c) for c in req.get("forget", []))
    if forget != sorted(request.forget) or req.get("kind", request.kind) != request.kind:
        raise ConfigError(
            f"{source} is a result for {req.get('kind')} clients {forget}; the audit is for "
            f"{request.kind} clients {sorted(request.forget)}. Pass the matching result"
        )
    claimed = ResultClaims.from_doc(result)
    return (
        list(claimed.warnings),
        lineage_from_dict(result.get("lineage")),
        claimed.method,
        list(claimed.assumptions),
    )


def _check_same_model(result: Mapping[str, Any], params: torch.Tensor, source: str) -> None:
    """Refuse a result that names another model than the one audited (its SHA-256)."""
    named = (result.get("apply") or {}).get("model_sha256")
    if named is not None and named != tensor_sha256(params):
        raise IntegrityError(
            f"{source} is the result of another model (its model SHA-256 {str(named)[:12]}... "
            f"differs from the audited model's {tensor_sha256(params)[:12]}...); its claims are "
            "not this model's. Audit the model it wrote, or drop --result"
        )


def replay_method(
    result: Mapping[str, Any], session: UnlearnSession, request: UnlearnRequest
) -> UnlearnResult:
    """Re-run the method a result names, with its parameters, on this run and request.

    In-process methods are deterministic (docs/architecture.md, "Where a bit-identity claim
    holds"): on the same machine and device the replay gives the result's model bit for bit.
    """
    from fedunlearn.unlearn import make_method

    samples = {int(c): [int(i) for i in ids] for c, ids in _samples_of(result).items()}
    return session.run(
        make_method(str(result.get("method", "")), result.get("params") or {}),
        UnlearnRequest.of(sorted(request.forget), request.kind, samples) if samples else request,
    )


def replay_exact(
    result: Mapping[str, Any],
    session: UnlearnSession,
    request: UnlearnRequest,
    params: torch.Tensor,
    source: str,
) -> UnlearnResult:
    """Recompute an exact result and refuse the claim unless it comes out bit for bit.

    An exact lineage is what ``removed`` rests on, and a result file is the server's word: the
    seal is a checksum anyone can recompute. The replay (``replay_method``) runs the named
    method on this run and request; the claim holds when the replay's own lineage is exact and
    its model is bitwise the audited one.

    Returns:
        The replayed result (its lineage is what the document's lineage must say).
    """
    replayed = replay_method(result, session, request)
    if replayed.lineage is None or not replayed.lineage.exact:
        raise IntegrityError(
            f"{source} claims an exact lineage, but replaying {result.get('method')} on this run "
            "reads the forgotten clients' influence (its lineage is "
            f"{replayed.lineage.kind if replayed.lineage else 'none'}); the claim is refused"
        )
    if tensor_sha256(replayed.params) != tensor_sha256(params):
        raise IntegrityError(
            f"{source} claims an exact lineage, but replaying {result.get('method')} on this run "
            "does not reproduce the audited model bit for bit; the claim is refused"
        )
    return replayed


def _check_served(session: UnlearnSession, params: torch.Tensor, source: str) -> None:
    """Accept an applied exact result's claim for the model the run serves, and only for it.

    Its request was applied (``apply`` replaced the rounds it recomputed), so it cannot be
    replayed on this generation of the run; the store recorded the result it applied, and the
    claim holds for the model the run now serves, bit for bit.
    """
    if tensor_sha256(params) != tensor_sha256(session.run_view.final_params):
        raise IntegrityError(
            f"{source} claims an exact lineage for clients the run removed by an applied result, "
            "but the audited model is not the model the run serves; the claim is refused"
        )


def _samples_of(result: Mapping[str, Any]) -> Mapping[str, Any]:
    samples = (result.get("request") or {}).get("samples") or {}
    return samples if isinstance(samples, Mapping) else {}


def forgotten_clients(session: UnlearnSession) -> list[int]:
    """Return the clients the run's store has deleted (its forget log), sorted."""
    ids: set[int] = set()
    for record in session.run_view.store.forget_records():
        if hasattr(record, "client_ids"):
            ids.update(int(c) for c in record.client_ids)
        else:
            ids.add(int(record.client_id))
    return sorted(ids)


def _result_document(
    result: str | Path | Mapping[str, Any] | None,
) -> tuple[Mapping[str, Any] | None, str]:
    """The method's result document (read, its seal checked) and how to name it."""
    if isinstance(result, str | Path):
        return read_result_file(result), str(result)
    source = "the result"
    if result is not None and "integrity" in result:  # a sealed document, even when parsed
        check_seal(result, source)
    return result, source


def _audit_request(
    session: UnlearnSession, forget: Sequence[int] | None, kind: str, run_dir: str | Path
) -> UnlearnRequest:
    """The request to judge: the named clients (default: those the store deleted)."""
    if forget is None:
        forget = forgotten_clients(session)
        if not forget:
            raise ConfigError(
                f"name the clients the model should have forgotten (--forget 3,7 or "
                f"'malicious'); the store of {run_dir} has deleted none"
            )
    request = UnlearnRequest.of(forget, kind)
    # a living run: the clients forgotten earlier are checked too (docs/lifecycle.md)
    request = UnlearnRequest(request.forget | session.run_view.forgotten, kind)
    session.run_view.check_request(request)
    return request


def audit_model(
    run_dir: str | Path,
    model: torch.Tensor | str | Path,
    forget: Sequence[int] | None = None,
    *,
    kind: str = "forget",
    receipt: ReceiptOptions | None = None,
    progress: Progress | None = None,
    result: str | Path | Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Return the receipt document of a model of the run's architecture.

    Args:
        run_dir: The finished run the model claims to have unlearned from.
        model: Flat parameters, or a model file (``read_model_file``).
        forget: The clients the model should have forgotten; default: those the run's store
            deleted.
        kind: ``forget`` or ``recover``.
        receipt: How the receipt is issued (``eval.plan.ReceiptOptions``: the reference,
            ``original`` or ``retrain`` (also run Retrain and judge against it), the
            thresholds, the client-level test, the distance band, the seed of the membership
            attacks); defaults if None.
        progress: Told about each stage (and Retrain's rounds).
        result: The method's result (the JSON ``fedunlearn unlearn --out`` wrote, its path, or
            the parsed document): its warnings, lineage and assumptions go into the receipt.
            None: the receipt says that none were available.

    Returns:
        ``{"subject", "request", "measures", "original", "retrain", "verification", ...}``.

    Raises:
        ConfigError: if no client is named and the store deleted none, the model does not
            fit the run, or the result is of another request.
    """
    options = receipt or ReceiptOptions()
    result_doc, source = _result_document(result)
    # an audit derives from the committed history alone (no RUN/derived/ file of the server's)
    with UnlearnSession(run_dir, derived_cache=False) as session:
        if isinstance(model, torch.Tensor):
            params, subject = model, "model"
        else:
            params = read_model_file(model, session.run_view.model)
            subject = Path(model).name
        request = _audit_request(session, forget, kind, run_dir)
        warnings: list[str] | None = None
        assumptions: list[str] | None = None
        lineage = None
        method = None
        if result_doc is not None:
            _check_same_run(result_doc, session, source)
            _check_same_model(result_doc, params, source)
            warnings, lineage, method, assumptions = _result_claims(result_doc, request, source)
        exact = lineage is not None and lineage.exact
        if exact and result_doc is not None:
            if request.forget <= session.run_view.applied:  # the served model of a living run
                _check_served(session, params, source)
            else:
                if progress is not None:
                    progress.on_step("replaying the exact result")
                replay_exact(result_doc, session, request, params, source)
        receipts = verifying_receipts(session, request, options, exact, progress, (1, 1))
        verifier = receipts.verifier
        row, verification = receipts.audit(
            params, subject, warnings=warnings, lineage=lineage, assumptions=assumptions
        )
        receipt_doc = verification.to_dict()
        receipt_doc["clients"] = client_entries(
            session.run_view, verification, verifier.deletion, request.forget
        )
        identity = session.identity()
    doc = {
        "schema_version": RESULTS_SCHEMA_VERSION,
        "subject": subject,
        "run_dir": str(run_dir),
        "run": identity,
        "request": {"forget": sorted(request.forget), "kind": request.kind},
        "result_method": method,
        "model_sha256": tensor_sha256(params),  # what check-receipt compares --model with
        "measures": row,
        "original": verifier.original_row,
        "retrain": verifier.retrain_row,
        "verification": receipt_doc,
    }
    seal(doc, identity)  # the receipt, bound to the run it judged the model on
    return doc
