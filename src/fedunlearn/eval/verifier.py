"""Issue receipts: verify unlearned models of one run against one request.

``Verifier(session, request)`` measures once what every receipt of the request shares: the
membership attack (``Judge``), the original model's row, Retrain's row when a Retrain reference
is given or asked for (``reference="retrain"``), and the store's deletion evidence. Then
``verify(result)`` returns the result with its ``verification`` attached, and ``audit(params)``
gives the receipt of any model of the run's architecture, including one trained or edited outside
the toolkit. The checks and their thresholds: ``fedunlearn.eval.checks`` and
docs/verification.md.

Example::

    with UnlearnSession("runs/demo") as session:
        request = UnlearnRequest.of(sorted(session.malicious), "recover")
        verifier = Verifier(session, request, reference="retrain")
        result = verifier.verify(session.run(make_method("crab"), request))
        print(result.verification.verdict)
        for reason in result.verification.reasons:
            print(reason)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import torch

from fedunlearn.errors import ConfigError, ForgottenDataError, HistoryError
from fedunlearn.eval.checks import Evidence, VerificationThresholds, build_verification
from fedunlearn.eval.distance import l2_distance
from fedunlearn.eval.judge import Judge
from fedunlearn.history.store import HistoryStore
from fedunlearn.unlearn import (
    Details,
    UnlearnRequest,
    UnlearnResult,
    UnlearnSession,
    Verification,
    make_method,
)

__all__ = ["REFERENCES", "Verifier", "deletion_evidence"]

REFERENCES = ("original", "retrain")


def _record_dict(record: Any) -> dict[str, Any]:
    """Return a store's deletion record as a JSON-ready dict (``to_dict`` or its fields)."""
    to_dict = getattr(record, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    return dataclasses.asdict(record)


def _record_clients(record: dict[str, Any]) -> set[int]:
    if "client_ids" in record:
        return {int(c) for c in record["client_ids"]}
    return {int(record["client_id"])} if "client_id" in record else set()


def deletion_evidence(store: HistoryStore, forget: Iterable[int]) -> dict[str, Any]:
    """Return what the store shows about the forgotten clients' update payloads.

    Fields (the ``deletion`` check reads them; a store may add more):

    - ``clients``: the forgotten client ids;
    - ``bytes_held``: client id -> update payload bytes still stored;
    - ``payloads_held``: how many of their update payloads are still stored;
    - ``records``: the store's deletion records about these clients (``forget_records()``,
      oldest first; with per-payload entries ``payloads`` where the store keeps them);
    - ``read_back``: every round a forgotten client took part in whose update is not stored
      was read: ``refused`` (``ForgottenDataError``: deleted), ``not_stored`` (never kept by
      the history policy), ``readable`` ([round, client] pairs that could still be read: a
      failure) and ``attempted``.

    Args:
        store: The run's history store (read-only is enough).
        forget: The forgotten client ids.
    """
    clients = sorted({int(c) for c in forget})
    by_client = store.stored_bytes_by_client()
    held = {c: int(by_client.get(c, 0)) for c in clients}
    records = [
        r
        for r in (_record_dict(x) for x in store.forget_records())
        if _record_clients(r) & set(clients)
    ]
    payloads_held = 0
    read_back: dict[str, Any] = {"attempted": 0, "refused": 0, "not_stored": 0, "readable": []}
    wanted = set(clients)
    for round_ in store.rounds():
        if round_ == 0:
            continue
        for rec in store.client_records(round_):
            if rec.client_id not in wanted:
                continue
            if store.has_update(round_, rec.client_id):
                payloads_held += 1
                continue
            read_back["attempted"] += 1
            try:
                store.read_update(round_, rec.client_id)
            except ForgottenDataError:
                read_back["refused"] += 1
            except HistoryError:
                read_back["not_stored"] += 1
            else:
                read_back["readable"].append([round_, rec.client_id])
    return {
        "clients": clients,
        "bytes_held": held,
        "payloads_held": payloads_held,
        "records": records,
        "read_back": read_back,
    }


def _method_warnings(details: Details | None) -> tuple[str, ...]:
    found = getattr(details, "warnings", ()) if details is not None else ()
    if isinstance(found, str):
        return (found,)
    return tuple(str(w) for w in found or ())


class Verifier:
    """Issues the receipt of models of one run for one request.

    Args:
        session: The opened run.
        request: The clients removed (and why: ``forget`` or ``recover``).
        thresholds: The checks' thresholds (defaults if None).
        reference: ``"original"`` (judge against the original model and fixed fallbacks: the
            distance check is n/a) or ``"retrain"`` (run Retrain once, now, unless ``retrain``
            is given, and judge against it too).
        retrain: A Retrain result for this request already computed (e.g. by a comparison).
        seed: Seed of the membership attacks.
        judge: A ``Judge`` of this session and request to reuse (its attack is fitted once).
        progress: Passed to ``session.run`` when Retrain is computed here.

    Raises:
        ConfigError: for an unknown ``reference``, or a ``retrain`` result of another method.
    """

    def __init__(
        self,
        session: UnlearnSession,
        request: UnlearnRequest,
        *,
        thresholds: VerificationThresholds | None = None,
        reference: str = "original",
        retrain: UnlearnResult | None = None,
        seed: int = 0,
        judge: Judge | None = None,
        progress: Callable[[dict[str, float]], None] | None = None,
    ) -> None:
        if reference not in REFERENCES:
            raise ConfigError(
                f"reference must be one of {', '.join(REFERENCES)}; got {reference!r}"
            )
        if retrain is not None and retrain.method != "retrain":
            raise ConfigError(f"retrain must be a result of 'retrain'; got '{retrain.method}'")
        session.check_request(request)
        self.session = session
        self.request = request
        self.thresholds = thresholds or VerificationThresholds()
        self.judge = judge or Judge(session, request, seed)
        if retrain is None and reference == "retrain":
            retrain = session.run(make_method("retrain"), request, progress=progress)
        self.retrain = retrain
        self.retrain_row: dict[str, Any] | None = None
        self.retrain_gap: float | None = None
        if retrain is not None:
            self.judge.retrain_params = retrain.params
            self.retrain_row = self.judge.judge(retrain)
            self.retrain_gap = l2_distance(session.final_params, retrain.params)
        self.original_row = self.judge.measure(session.final_params, "original")
        self.deletion = deletion_evidence(session.store, request.forget)
        malicious = session.malicious
        self._attack = {
            "backdoor": session.setup.trigger is not None,
            "attackers_forgotten": len(malicious & request.forget),
            "attackers_total": len(malicious),
        }

    @property
    def references(self) -> tuple[str, ...]:
        """The reference models in use."""
        return ("original", "retrain") if self.retrain is not None else ("original",)

    def evidence(self, row: dict[str, Any], details: Details | None = None) -> Evidence:
        """Return the checks' evidence for a model's row (from this verifier's ``judge``)."""
        return Evidence(
            row=row,
            original=self.original_row,
            retrain=self.retrain_row,
            retrain_gap=self.retrain_gap,
            request_kind=self.request.kind,
            bound=details.certified_bound() if details is not None else None,
            warnings=_method_warnings(details),
            deletion=self.deletion,
            **self._attack,
        )

    def verification(
        self, row: dict[str, Any], details: Details | None = None, subject: str = ""
    ) -> Verification:
        """Return the receipt of a model from its row (``judge.judge`` or ``judge.measure``)."""
        return build_verification(self.evidence(row, details), self.thresholds, subject=subject)

    def verify(self, result: UnlearnResult) -> UnlearnResult:
        """Return ``result`` with its receipt attached (``result.verification``)."""
        row = self.judge.judge(result)
        return replace(result, verification=self.verification(row, result.details, result.method))

    def audit(
        self, params: torch.Tensor, subject: str = "model"
    ) -> tuple[dict[str, Any], Verification]:
        """Return the measures and the receipt of any model of the run's architecture.

        Args:
            params: The model's flat parameters (``fedunlearn.models.get_flat_params`` order).
            subject: What the model is (shown on the receipt), e.g. its file name.

        Raises:
            ConfigError: if ``params`` is not a flat vector of the run's model size.
        """
        expected = self.session.final_params.numel()
        if params.ndim != 1 or params.numel() != expected:
            raise ConfigError(
                f"the model has {params.numel()} parameters in shape {tuple(params.shape)}; this "
                f"run's {self.session.config.model.name} has {expected} (a flat vector). Audit a "
                "model of the run's architecture."
            )
        row = self.judge.measure(params.detach().to(torch.float32), subject)
        return row, self.verification(row, None, subject)
