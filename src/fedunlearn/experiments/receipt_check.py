"""An auditor's check of a result or receipt against the run it names (``check-receipt``).

``check_receipt(result_json, run_dir, model=None)`` trusts nothing the document says about
itself: it checks, one finding each,

- ``seal``: the document's integrity digest (``history.digest``: an edit that did not recompute
  it);
- ``run``: that it names this run (its config fingerprint, generation and last round);
- ``chain``: that the run's committed history verifies (``HistoryStore.check_chain``), that the
  head the document names (``run.chain``) is a link of it, that nothing but ``forget`` changed
  the run after that link, and that the run's model is the one the document names;
- ``request``: that its forget set is a valid request on this run and includes every client
  forgotten earlier;
- ``verdict``: that every influence word it states is one a receipt gives (``removed`` only
  with basis ``exact_lineage`` on an exact lineage: ``history.result_claims.removal_problem``),
  the receipt's own and each client's, whether or not anything can be re-run;
- ``model``: that the model the document speaks of (``--model``, or its apply file) has the
  SHA-256 it names;
- ``figures``: that the model's quality figures (test accuracy, loss, backdoor ASR) come out of
  an evaluation of that model exactly as written (an edited figure under a recomputed seal);
- ``replay``: that re-running the named method with its parameters on the run reproduces the
  model bit for bit. For an exact lineage (Retrain, ``tv_exact``, ``shard_retrain``) the replay
  must also be exact (``audit.replay_exact``): it proves the removal. For any other lineage
  (Crab's participation rollback replays stored updates of the remaining clients, which carry
  the forgotten clients' influence) it proves the computation only: the model is what the named
  method computes from the committed history, and removal rests on the statistical checks.
  Either way the document's lineage (and a verification's lineage, or its influence removed
  by an exact lineage) must be the replay's own: a recomputed seal cannot carry a forged one.

What it proves, against whom: docs/verification.md ("Checking a receipt as an auditor").
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedunlearn.errors import (
    ConfigError,
    HistoryError,
    IntegrityError,
    UnsupportedHistoryError,
)
from fedunlearn.eval.verifier import lineage_from_dict
from fedunlearn.experiments.audit import (
    read_json_file,
    read_model_file,
    replay_exact,
    replay_method,
)
from fedunlearn.experiments.compare import result_privacy_of
from fedunlearn.history.digest import canonical_json, check_seal
from fedunlearn.history.result_claims import ResultClaims
from fedunlearn.history.result_file import file_sha256, read_result_file, tensor_sha256
from fedunlearn.runs import run_fingerprint
from fedunlearn.unlearn import UnlearnRequest, UnlearnResult, UnlearnSession, make_method
from fedunlearn.unlearn.lineage import Lineage

__all__ = ["Finding", "ReceiptCheck", "check_receipt"]

# links that may follow the receipt's head without changing the state it was computed on
_STATE_KEEPING_LINKS = frozenset({"forget"})
_FIGURES = ("test_accuracy", "test_loss", "backdoor_asr")


@dataclass(frozen=True)
class Finding:
    """One check: ``ok`` True (holds), False (the claim fails) or None (nothing to check)."""

    name: str
    ok: bool | None
    line: str


@dataclass(frozen=True)
class ReceiptCheck:
    """Every finding of ``check_receipt``, in order; ``ok`` unless one failed."""

    findings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        """No finding failed."""
        return all(f.ok is not False for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {
            "ok": self.ok,
            "findings": [{"name": f.name, "ok": f.ok, "line": f.line} for f in self.findings],
        }


def _read_document(path: Path) -> dict[str, Any]:
    doc = read_json_file(path, str(path), "; pass the JSON 'unlearn --out' or 'audit' wrote")
    if not isinstance(doc, dict) or not isinstance(doc.get("request"), Mapping):
        raise ConfigError(
            f"{path} is not a result of 'fedunlearn unlearn' or a receipt of 'fedunlearn "
            "audit' (no 'request'); pass the file its --out wrote"
        )
    if not isinstance(doc.get("run"), Mapping):
        raise ConfigError(f"{path} names no run ('run'); it cannot be checked against one")
    return doc


def _seal(doc: Mapping[str, Any], source: str) -> Finding:
    try:
        check_seal(doc, source)
    except IntegrityError as err:
        return Finding("seal", False, str(err))
    return Finding("seal", True, "the integrity digest matches the content")


def _run(doc: Mapping[str, Any], session: UnlearnSession) -> Finding:
    run = doc["run"]
    expected = run_fingerprint(
        session.run_view.config, run.get("generation", 0), run.get("last_round")
    )
    if run.get("fingerprint") != expected:
        return Finding(
            "run", False, "the document names another run (its config fingerprint differs)"
        )
    return Finding(
        "run",
        True,
        f"names this run (generation {run.get('generation', 0)}, round {run.get('last_round')})",
    )


def _chain(doc: Mapping[str, Any], session: UnlearnSession) -> Finding:
    """The committed history, the document's head in it, and the run's model at that head."""
    store = session.run_view.store
    named = doc["run"].get("chain")
    check = store.check_chain(full=True)
    if not check.present and check.ok:
        if named:
            return Finding(
                "chain",
                False,
                f"the document names chain head {str(named.get('head'))[:16]}... but the run "
                "has no committed history",
            )
        return Finding(
            "chain", None, "no committed history (a run written before it): nothing to check"
        )
    if not check.ok:
        more = f" (and {len(check.problems) - 1} more)" if len(check.problems) > 1 else ""
        return Finding(
            "chain", False, f"the run's history is damaged: {check.problems[0][1]}{more}"
        )
    if not isinstance(named, Mapping):
        return Finding("chain", False, "the document names no chain head, though the run keeps one")
    seq, head = named.get("seq"), named.get("head")
    if type(seq) is not int or store.chain_link(seq) != head:
        return Finding(
            "chain",
            False,
            f"the document's head (link {seq}, {str(head)[:16]}...) is not in this run's chain: "
            "the history was rewritten since, or the document is of another run",
        )
    later = [(s, kind) for s, kind, _, _ in store.chain_links() if s > seq]
    changed = [f"link {s} ({kind})" for s, kind in later if kind not in _STATE_KEEPING_LINKS]
    if changed:
        raise ConfigError(
            f"the run changed after the document's head (link {seq}): {', '.join(changed[:3])}; "
            "check it on the run as it was then (a copy taken with the document)"
        )
    last = session.run_view.num_rounds
    if tensor_sha256(session.run_view.final_params) != doc["run"].get("model_sha256"):
        return Finding(
            "chain",
            False,
            f"the run's model at round {last} is not the one the document names (model SHA-256)",
        )
    return Finding(
        "chain",
        True,
        f"{check.links} links verify; head {head[:16]}... (link {seq}) is in the chain"
        + (f", followed by {len(later)} forget link(s)" if later else "")
        + f"; the run's model at round {last} is the one named",
    )


def _forgotten_after(doc: Mapping[str, Any], session: UnlearnSession) -> set[int]:
    """Clients first forgotten by ``forget`` links after the document's head (none without one).

    A later ``forget`` keeps the state the document was computed on (``_chain``); the clients it
    forgot were not yet forgotten then, so the document's request need not name them.
    """
    named = doc.get("run", {}).get("chain")
    seq = named.get("seq") if isinstance(named, Mapping) else None
    if type(seq) is not int:
        return set()
    before: set[int] = set()
    after: set[int] = set()
    for s, kind, body, _ in session.run_view.store.chain_links():
        if kind == "forget":
            clients = {int(c) for c in body.get("clients", [])}
            (before if s <= seq else after).update(clients)
    return after - before


def _request(doc: Mapping[str, Any], session: UnlearnSession) -> tuple[Finding, UnlearnRequest]:
    req = doc["request"]
    try:
        forget = [int(c) for c in req.get("forget", [])]
        request = UnlearnRequest.of(forget, str(req.get("kind", "forget")))
    except (TypeError, ValueError) as err:
        raise ConfigError(f"the document's request is not a request: {err}") from None
    missing = sorted(session.run_view.forgotten - request.forget - _forgotten_after(doc, session))
    if missing:
        return (
            Finding(
                "request",
                False,
                f"the request does not forget client(s) {missing}, forgotten earlier in the run",
            ),
            request,
        )
    try:
        session.run_view.check_request(request)
    except ConfigError as err:
        return Finding("request", False, f"not a request on this run: {err}"), request
    return Finding("request", True, f"{request.kind} clients {sorted(request.forget)}"), request


def _named_model_sha(doc: Mapping[str, Any]) -> str | None:
    apply = doc.get("apply")
    if isinstance(apply, Mapping) and isinstance(apply.get("model_sha256"), str):
        return apply["model_sha256"]
    named = doc.get("model_sha256")
    return named if isinstance(named, str) else None


def _model(
    doc: Mapping[str, Any], path: Path, session: UnlearnSession, model: Path | None
) -> tuple[Finding, torch.Tensor]:
    named = _named_model_sha(doc)
    if named is None:
        raise ConfigError(f"{path} names no model SHA-256 ('apply.model_sha256'); nothing to check")
    if model is not None:
        params = read_model_file(model, session.run_view.model)
        where = str(model)
    else:
        apply = doc.get("apply") or {}
        file = path.parent / str(apply.get("file", ""))
        if not apply.get("file") or not file.is_file():
            raise ConfigError(
                f"{path}: its apply file is gone (applied, or moved); pass the model with --model"
            )
        if file_sha256(file) != apply.get("sha256"):
            return (
                Finding("model", False, f"{file} is not the apply file the document names"),
                torch.empty(0),
            )
        params, where = read_result_file(file).params, str(file)
    got = tensor_sha256(params)
    if got != named:
        return (
            Finding(
                "model",
                False,
                f"{where} is another model (SHA-256 {got[:12]}..., the document names "
                f"{named[:12]}...)",
            ),
            params,
        )
    return Finding("model", True, f"{where} has the SHA-256 the document names"), params


def _figures(doc: Mapping[str, Any], session: UnlearnSession, params: torch.Tensor) -> Finding:
    measured = session.evaluation.evaluate(params)
    measures = doc.get("measures")
    written = measures if isinstance(measures, Mapping) else doc
    compared, wrong = [], []
    for key in _FIGURES:
        if key not in measured or key not in written:
            continue
        value, claimed = float(measured[key]), written[key]
        compared.append(key)
        same = (
            claimed is None
            and not math.isfinite(value)
            or isinstance(claimed, int | float)
            and (claimed == value or (math.isnan(claimed) and math.isnan(value)))
        )
        if not same:
            wrong.append(f"{key} is {claimed} in the document, {value} re-derived")
    if wrong:
        return Finding("figures", False, "; ".join(wrong))
    if not compared:
        return Finding("figures", None, "no figure to re-derive")
    return Finding("figures", True, f"{', '.join(compared)} re-derived exactly")


def _replay(
    doc: Mapping[str, Any],
    session: UnlearnSession,
    request: UnlearnRequest,
    params: torch.Tensor,
    source: str,
) -> Finding:
    if "method" not in doc:  # a receipt (audit --out) names no method parameters
        return _receipt_replay(doc)
    lineage = lineage_from_dict(doc.get("lineage"))
    later = _forgotten_after(doc, session) - request.forget
    if later:  # a re-run now would forget them too (requests are cumulative)
        exact = lineage is not None and lineage.exact
        return Finding(
            "replay",
            False if exact else None,
            f"client(s) {sorted(later)} were forgotten after the document's head, and a re-run on "
            "the run as it is now would forget them too, so it cannot reproduce the document"
            + ("'s exact lineage" if exact else " (its lineage is not exact: nothing is lost)")
            + "; check on a copy of the run taken with the document",
        )
    if lineage is not None and lineage.exact:
        try:
            replayed = replay_exact(doc, session, request, params, source)
        except IntegrityError as err:
            return Finding("replay", False, str(err))
        except (HistoryError, UnsupportedHistoryError) as err:  # a later forget took its reads
            return Finding(
                "replay",
                False,
                f"{doc.get('method')} cannot be replayed on this run as it is now ({err}), so its "
                "exact lineage cannot be shown; check on a copy of the run taken with the document",
            )
        return _claims_finding(
            doc,
            replayed,
            session,
            f"{doc.get('method')} re-run on this run gives the model bit for bit (same SHA-256)",
        )
    return _replay_computation(doc, session, request, params, lineage)


def _as_json(value: Any) -> Any:
    """``value`` as a result file holds it (a JSON round trip of its canonical form)."""
    return json.loads(canonical_json(value))


def _claims_finding(
    doc: Mapping[str, Any], replayed: UnlearnResult, session: UnlearnSession, agreed: str
) -> Finding:
    """The replay's finding once its model is the document's: a contradicted claim, or ok."""
    wrong = _lineage_claims(doc, replayed.lineage) or _other_claims(doc, replayed, session)
    if wrong:
        return Finding("replay", False, wrong)
    return Finding("replay", True, agreed)


def _other_claims(
    doc: Mapping[str, Any], replayed: UnlearnResult, session: UnlearnSession
) -> str | None:
    """The method's warnings and the privacy statement: the replay's, not the server's word.

    Both are recomputed (the warnings by the re-run, the privacy statement from the run's
    ledger and the method's parameters, as ``unlearn`` writes it); a document that edited
    either under a recomputed seal fails. Timings and costs are measurements of the server's
    machine and are not compared.
    """
    details = doc.get("details")
    stated = details.get("warnings") if isinstance(details, Mapping) else None
    truth = _as_json(replayed.details.to_dict()).get("warnings")
    if stated != truth:
        return "the document's method warnings are not the ones the re-run gives"
    if "privacy" in doc:
        method = str(doc.get("method", ""))
        params = make_method(method, doc.get("params") or {}).params
        run = session.run_view
        expected = _as_json(result_privacy_of(run.config, run.store, method, params))
        if doc["privacy"] != expected:
            return (
                "the document's privacy statement is not the one this run's ledger and the "
                "method's parameters give"
            )
    return None


def _lineage_claims(doc: Mapping[str, Any], replayed: Lineage | None) -> str | None:
    """What the document says about the lineage that the replay's own lineage contradicts.

    The lineage (what the method read of the forgotten clients) and a verdict of influence
    removed by construction are claims under the seal, which anyone can recompute: they must be
    the replay's, not the server's word.
    """
    truth = None if replayed is None else json.loads(json.dumps(replayed.to_dict()))
    if doc.get("lineage") != truth:
        return (
            f"the document's lineage is not the one {doc.get('method')} has when re-run on "
            f"this run (re-run: {'none' if truth is None else truth['kind']}, "
            f"{'' if truth is None else truth['reason']})"
        )
    verification = doc.get("verification")
    if not isinstance(verification, Mapping):
        return None
    if "lineage" in verification and verification["lineage"] != truth:
        return "the document's verification states another lineage than the re-run's"
    if verification.get("influence_basis") == "exact_lineage" and not (
        replayed is not None and replayed.exact
    ):
        return (
            "the document's verification says the influence was removed by an exact lineage; "
            f"the re-run's lineage is {'none' if replayed is None else replayed.kind}"
        )
    return None


def _verdict(doc: Mapping[str, Any]) -> Finding:
    """The influence words: ``removed`` only by an exact lineage (no replay needed to tell).

    Checked for every document, result or receipt, before and whatever the replay: a word a
    receipt never gives fails here even where nothing can be re-run (a receipt, or a client
    forgotten since the document's head).
    """
    problem = ResultClaims.from_doc(doc).unsupported_removal()
    if problem is not None:
        return Finding("verdict", False, f"not a verdict a receipt gives: {problem}")
    if not isinstance(doc.get("verification"), Mapping):
        return Finding("verdict", None, "no receipt: no verdict to check")
    return Finding(
        "verdict",
        True,
        "every influence word is one a receipt gives (removed only by an exact lineage)",
    )


def _receipt_replay(doc: Mapping[str, Any]) -> Finding:
    """A receipt (``audit --out``) carries no method parameters: nothing can be re-run.

    A removal it states by an exact lineage therefore cannot be shown from it (a re-sealed
    receipt could say anything): that claim fails here, and the result it was made from
    (``unlearn --out``) is what to check.
    """
    verification = doc.get("verification")
    claims = verification if isinstance(verification, Mapping) else {}
    stated = claims.get("lineage")
    exact = claims.get("influence_basis") == "exact_lineage" or (
        isinstance(stated, Mapping) and stated.get("kind") == "exact"
    )
    if exact:
        return Finding(
            "replay",
            False,
            "this receipt states removal by an exact lineage but names no method parameters to "
            "re-run, so the claim cannot be shown from it; check the result it was made from "
            "(fedunlearn check-receipt RESULT.json --run RUN)",
        )
    return Finding(
        "replay",
        None,
        "a receipt (audit --out) names no method to re-run; its statistical checks hold "
        "against an honest-but-curious server only",
    )


def _replay_computation(
    doc: Mapping[str, Any],
    session: UnlearnSession,
    request: UnlearnRequest,
    params: torch.Tensor,
    lineage: Lineage | None,
) -> Finding:
    """Replay a result without an exact lineage: it proves the computation, not the removal.

    The model must be what the named method computes from the committed history (a server that
    names Crab but serves something else fails); the removal itself rests on the receipt's
    statistical checks, which hold against an honest-but-curious server only.
    """
    method = doc.get("method")
    kind = "none" if lineage is None else lineage.kind
    try:
        replayed = replay_method(doc, session, request)
    except UnsupportedHistoryError as err:  # a later forget took what it reads
        return Finding(
            "replay",
            None,
            f"{method} cannot be replayed on this run as it is now ({err}); its lineage is "
            f"{kind}, so the replay would prove the computation only; check on a copy of the run "
            "taken with the document",
        )
    except (HistoryError, ConfigError) as err:
        return Finding("replay", False, f"{method} cannot be replayed on this run: {err}")
    if tensor_sha256(replayed.params) != tensor_sha256(params):
        return Finding(
            "replay",
            False,
            f"{method} re-run on this run does not give the document's model bit for bit: the "
            f"model is not what {method} computes from this run's committed history",
        )
    return _claims_finding(
        doc,
        replayed,
        session,
        f"{method} re-run on this run gives the model bit for bit (same SHA-256); its lineage is "
        f"{kind}, so this proves the computation, not the removal: removal rests on the "
        "receipt's statistical checks (against an honest-but-curious server only)",
    )


def check_receipt(
    result_json: str | Path, run_dir: str | Path, *, model: str | Path | None = None
) -> ReceiptCheck:
    """Check a result (``unlearn --out``) or receipt (``audit --out``) against ``run_dir``.

    Args:
        result_json: The document.
        run_dir: The run it names.
        model: The model it speaks of; default the apply file beside a result.

    Returns:
        Every finding; the replay is skipped (None) once another check failed.

    Raises:
        ConfigError: Unreadable input, no model to check, or a run that changed (applied,
            trained on) after the document's head.
        HistoryError: ``run_dir`` holds no finished run.
    """
    path = Path(result_json)
    doc = _read_document(path)
    source = str(path)
    findings = [_seal(doc, source)]
    # derived_cache=False: the replay derives everything from the committed history, never
    # from a file the server keeps beside it (RUN/derived/), and writes nothing into the run
    with UnlearnSession(run_dir, evaluate=False, derived_cache=False) as session:
        findings.append(_run(doc, session))
        findings.append(_chain(doc, session))
        found, request = _request(doc, session)
        findings.append(found)
        findings.append(_verdict(doc))
        found, params = _model(doc, path, session, None if model is None else Path(model))
        findings.append(found)
        if found.ok and findings[1].ok:  # another run's model may not even fit this one's
            findings.append(_figures(doc, session, params))
        if all(f.ok is not False for f in findings):
            findings.append(_replay(doc, session, request, params, source))
        else:
            findings.append(Finding("replay", None, "skipped: the document already fails"))
    return ReceiptCheck(tuple(findings))
