"""Judge models of one run against one request: the receipt's measurements and its rules.

``Verifier(session, request, retrain=...)`` trains nothing: it takes the references measured
before (``fedunlearn.eval.plan.open_receipts`` measures them and builds it; all training is in
``fedunlearn.eval.references``), measures once what every receipt of the request shares (the
membership attacks of its ``Judge``; the rows of the original, of the original plus small
noise, of Retrain and of the clean models trained less and more than Retrain; their
participation-marker rates; the clean ASR of M_0; ``||M_0 - Retrain||``; the store's deletion
evidence) and then judges any number of models: ``verify(result)`` attaches the receipt,
``audit(params)`` gives the receipt of any model of the run's architecture. A ``not_detected``
receipt carries the request's detection limit (``detection_limit``), measured once on
interpolations between the clean reference and the original. The rules and their thresholds:
``fedunlearn.eval.receipt`` and docs/verification.md.

Example::

    with UnlearnSession("runs/demo") as session:
        request = UnlearnRequest.of(sorted(session.run_view.malicious), "recover")
        receipts = open_receipts(session, request, ReceiptOptions("retrain"))
        result = receipts.verify(session.run(make_method("crab"), request))
        print(result.verification.influence, result.verification.deciding)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

import torch

from fedunlearn.errors import ConfigError
from fedunlearn.eval.distance import l2_distance
from fedunlearn.eval.distance_band import DistanceBand
from fedunlearn.eval.judge import Judge
from fedunlearn.eval.markers import MarkerEvidence, MarkerProbe
from fedunlearn.eval.mia.client import ClientMembershipEvidence
from fedunlearn.eval.receipt import (
    Attack,
    Claims,
    Controls,
    Evidence,
    VerificationThresholds,
    build_verification,
)
from fedunlearn.eval.references import clean_path
from fedunlearn.history.result_claims import ResultClaims
from fedunlearn.history.store import HistoryStore
from fedunlearn.runs.forget import store_evidence
from fedunlearn.unlearn import (
    Details,
    UnlearnRequest,
    UnlearnResult,
    UnlearnSession,
    Verification,
)
from fedunlearn.unlearn.lineage import Lineage
from fedunlearn.unlearn.receipt import NO_LIMIT_CODE

__all__ = ["Verifier", "deletion_evidence", "lineage_from_dict"]


# steps toward the original at which the detection limit is measured, from the original down
LIMIT_STEPS = (1.0, 0.75, 0.5, 0.3, 0.2, 0.1, 0.05)


def deletion_evidence(store: HistoryStore, forget: Iterable[int]) -> dict[str, Any]:
    """Return what the store (and its run directory) shows about the forgotten clients' updates.

    The receipt's JSON of ``runs.forget.store_evidence``, the one implementation every reader
    uses (fields: ``history.store.evidence.DeletionEvidence``, with the run directory's result
    files and ``participation``).

    Args:
        store: The run's history store (read-only is enough).
        forget: The forgotten client ids.
    """
    return store_evidence(store, forget).to_dict()


def _method_claims(details: Details | None) -> ResultClaims:
    """What a method's details claim (its warnings, assumptions); nothing without details."""
    return ResultClaims.from_doc({} if details is None else {"details": details.claim_fields()})


class Verifier:
    """Issues the receipt of models of one run for one request.

    It trains nothing: the references it judges against are measured before
    (``fedunlearn.eval.plan.measure_references``, or ``eval.references`` one by one) and passed
    in. It evaluates them once (their rows) and then any number of models.

    Args:
        session: The opened run.
        request: The clients removed (and why: ``forget`` or ``recover``).
        thresholds: The checks' thresholds (defaults if None).
        retrain: Retrain's result for this request (``reference_retrain``), to judge against
            it too; None judges against the original model and fixed fallbacks (the distance
            check is n/a).
        seed: Seed of the membership attacks and of the noise control.
        judge: A ``Judge`` of this session and request to reuse (its attack is fitted once);
            it keeps no state of this verifier.
        noise_std: Standard deviation of the Gaussian noise added to the original model for
            the second negative control (0 skips it).
        client_membership: The client-level membership test of this request, as a function of
            a model's flat parameters returning ``ClientMembershipEvidence`` whose ``scores``
            include ``candidate`` (and ``original``, ``retrain``); None: the check is n/a.
        distance_band: The band of independent exact retrains (``eval.distance_band``), or
            None: the fixed ``distance_pass``.
        clean_path_models: Retrain's earlier global models (``clean_path``), when the caller
            kept them and dropped ``retrain``'s trajectory; None takes them from ``retrain``.
        continued_models: Retrain continued by the remaining clients
            (``references.continued_controls``): the clean controls trained more.
        attacks: Fit and run the membership attacks (shadow models: training); False leaves
            the membership check n/a (a receipt that needs no evidence: an exact lineage).

    Raises:
        ConfigError: for a ``retrain`` result of another method.
    """

    def __init__(
        self,
        session: UnlearnSession,
        request: UnlearnRequest,
        *,
        thresholds: VerificationThresholds | None = None,
        retrain: UnlearnResult | None = None,
        seed: int = 0,
        judge: Judge | None = None,
        noise_std: float = 1e-3,
        client_membership: Callable[[torch.Tensor], ClientMembershipEvidence] | None = None,
        distance_band: DistanceBand | None = None,
        clean_path_models: Mapping[str, torch.Tensor] | None = None,
        continued_models: Mapping[str, torch.Tensor] | None = None,
        attacks: bool = True,
    ) -> None:
        if retrain is not None and retrain.method != "retrain":
            raise ConfigError(f"retrain must be a result of 'retrain'; got '{retrain.method}'")
        run = session.run_view
        run.check_request(request)
        self.run = run
        self.request = request
        self.thresholds = thresholds or VerificationThresholds()
        self.judge = judge or Judge(run, session.evaluation, request, seed, attacks=attacks)
        self.retrain = retrain
        self.retrain_params = retrain.params if retrain is not None else None
        self.client_membership = client_membership
        self.distance_band = distance_band if retrain is not None else None
        self.noise_std = noise_std
        self.marker_probe = MarkerProbe(session.evaluation, request)
        self._marker_controls: dict[str, tuple[dict, dict]] = {}
        self.retrain_row = None if retrain is None else self.judge.judge(retrain, retrain.params)
        self.original_row = self.judge.measure(run.final_params, "original", self.retrain_params)
        self.noisy_params = self._noisy(run.final_params, noise_std, seed)
        self.noisy_original_row = (
            None
            if self.noisy_params is None
            else self.judge.measure(self.noisy_params, "original + noise", self.retrain_params)
        )
        path = clean_path(retrain) if clean_path_models is None else dict(clean_path_models)
        self._measure_markers(retrain, path)
        self.clean_path_rows = self._rows(session, path)
        self.continued_rows = self._rows(session, dict(continued_models or {}))
        self.deletion = deletion_evidence(run.store, request.forget)
        self._limit: dict[str, Any] | None = None
        self.attack = self._attack(session, request)
        self.controls = self._controls(session, retrain)

    @staticmethod
    def _noisy(params: torch.Tensor, std: float, seed: int) -> torch.Tensor | None:
        if std <= 0:
            return None
        g = torch.Generator().manual_seed(seed)
        return params + torch.randn(params.shape, generator=g) * std

    def _measure_markers(self, retrain: UnlearnResult | None, path: Mapping) -> None:
        """The participation-marker rates of the controls, measured once."""
        if not self.marker_probe:
            return
        models = {"original": self.run.final_params, "original + noise": self.noisy_params}
        if retrain is not None:
            models["retrain"] = retrain.params
        models.update(path)
        for label, params in models.items():
            if params is not None:
                self._marker_controls[label] = self.marker_probe.rates(params)

    def _rows(self, session: UnlearnSession, models: Mapping) -> dict[str, dict[str, Any]]:
        """Evaluation rows (accuracy, backdoor ASR) of clean controls, when an attack needs them."""
        if session.evaluation.trigger is None and not self.run.malicious:
            return {}
        return {label: dict(session.evaluation.evaluate(p)) for label, p in models.items()}

    def _attack(self, session: UnlearnSession, request: UnlearnRequest) -> Attack:
        run, malicious = self.run, self.run.malicious
        return Attack(
            request_kind=request.kind,
            clients=tuple(sorted(request.forget)),
            backdoor=session.evaluation.trigger is not None,
            attackers_forgotten=len(malicious & request.forget),
            # an earlier client an applied result removed is not in the current model (the
            # checks' control): it cannot make the backdoor check's pass indecisive
            clients_forgotten=len(request.forget - run.applied),
            attackers_total=len(malicious),
            kind=run.config.attack.kind if malicious else None,
            private_run=bool(run.config.privacy.enabled),
        )

    def _controls(self, session: UnlearnSession, retrain: UnlearnResult | None) -> Controls:
        run, r = self.run, self.retrain_params
        clean_asr = None
        if session.evaluation.trigger is not None:
            clean_asr = session.evaluation.evaluate(run.initial_params).get("backdoor_asr")
        return Controls(
            original=self.original_row,
            noisy=self.noisy_original_row,
            noise_std=self.noise_std if self.noisy_original_row is not None else None,
            retrain=self.retrain_row,
            retrain_gap=None if r is None else l2_distance(run.final_params, r),
            initial_gap=None if r is None else l2_distance(run.initial_params, r),
            clean_asr=clean_asr,
            clean_less=self.clean_path_rows,
            clean_more=self.continued_rows,
            private_reference=bool(
                retrain is not None and getattr(retrain.details, "private", False)
            ),
            # a living run whose applied results removed every forgotten client: the current
            # model, the controls' "original", carries none of their influence
            original_carries=not (self.request.forget and self.request.forget <= run.applied),
        )

    @property
    def references(self) -> tuple[str, ...]:
        """The reference models in use."""
        return ("original", "retrain") if self.retrain is not None else ("original",)

    @property
    def retrain_gap(self) -> float | None:
        """``||o - r||`` (None without Retrain)."""
        return self.controls.retrain_gap

    @property
    def initial_gap(self) -> float | None:
        """``||M_0 - r||`` (None without Retrain)."""
        return self.controls.initial_gap

    def evidence(
        self,
        row: dict[str, Any],
        details: Details | None = None,
        *,
        lineage: Lineage | None = None,
        warnings: Iterable[str] | None = None,
        client_membership: ClientMembershipEvidence | None = None,
        markers: MarkerEvidence | None = None,
        assumptions: Iterable[str] | None = None,
    ) -> Evidence:
        """Return the rules' evidence for a model's row (from this verifier's ``judge``).

        ``warnings`` overrides the details' warnings (an audit's ``--result``); with neither
        details nor warnings, the receipt says that none were available. ``assumptions``
        likewise overrides the details' assumptions.
        """
        claimed = _method_claims(details)
        found = claimed.warnings if warnings is None else tuple(warnings)
        assumed = claimed.assumptions if assumptions is None else tuple(assumptions)
        claims = Claims(
            bound=details.certified_bound() if details is not None else None,
            warnings=found,
            warnings_available=details is not None or warnings is not None,
            lineage=lineage,
            assumptions=assumed,
        )
        return Evidence(
            row=row,
            controls=self.controls,
            attack=self.attack,
            claims=claims,
            client_membership=client_membership,
            markers=markers,
            distance_band=self.distance_band,
            deletion=self.deletion,
        )

    def verification(
        self,
        row: dict[str, Any],
        details: Details | None = None,
        subject: str = "",
        *,
        lineage: Lineage | None = None,
        warnings: Iterable[str] | None = None,
        params: torch.Tensor | None = None,
        assumptions: Iterable[str] | None = None,
        measure_limit: bool = True,
    ) -> Verification:
        """Return the receipt of a model from its row (``judge.judge`` or ``judge.measure``).

        ``params`` (the model's flat parameters) feed the client-level membership test when
        the verifier has one, and the participation markers of the forgotten clients. A
        ``not_detected`` receipt carries the request's detection limit (``detection_limit``).
        """
        membership = None
        if self.client_membership is not None and params is not None:
            membership = self.client_membership(params)
        markers = None
        if self.marker_probe and params is not None:
            markers = self.marker_probe.evidence(params, self._marker_controls)
        evidence = self.evidence(
            row,
            details,
            lineage=lineage,
            warnings=warnings,
            client_membership=membership,
            markers=markers,
            assumptions=assumptions,
        )
        receipt = build_verification(evidence, self.thresholds, subject=subject)
        if measure_limit and receipt.influence == "not_detected":
            receipt = replace(receipt, detection_limit=self.detection_limit())
        return receipt

    def _clean_end(self) -> tuple[torch.Tensor | None, str]:
        """The clean model the detection limit steps from: Retrain, else the client test's."""
        if self.retrain_params is not None:
            return self.retrain_params, "Retrain"
        controls = getattr(self.client_membership, "controls", None) or {}
        if "retrain" in controls:
            return controls["retrain"], "Retrain (the client-level test's clean control)"
        return None, ""

    def detection_limit(self) -> dict[str, Any]:
        """The smallest step from a clean model toward the original that the receipt flags.

        Measured once per request (evaluation only, no training) on the interpolations
        ``clean + lambda (original - clean)`` for ``lambda`` in ``LIMIT_STEPS``, from 1 (the
        original) down to the first one the receipt does not flag: ``lambda`` is the smallest
        step flagged (``remains``) with every larger one flagged too. Clean: Retrain, else
        the Retrain the client-level test trained; without either it is not measured. A check
        that states no limit (the held-out client test, code ``held_out_null``: steps from
        Retrain understate what it misses) is not counted (``not_counted``): a ``not_detected``
        beside it rests on the other checks, and this is their limit.
        """
        if self._limit is not None:
            return self._limit
        # a client test that says steps from the clean models understate what it misses (the
        # held-out null, scale-free on Retrain's line: it flags every step): its flags are not
        # counted, and the limit is the other checks' (its pass grounds no not_detected either)
        why = getattr(self.client_membership, "limit_reason", None)
        clean, name = self._clean_end()
        if clean is None:
            self._limit = {
                "lambda": None,
                "reason": "no clean reference: --reference retrain or the client-level test",
            }
            return self._limit
        original = self.run.final_params
        measured: dict[str, list[str]] = {}
        smallest, below = None, None
        for step in LIMIT_STEPS:
            params = clean + step * (original - clean)
            row = self.judge.measure(params, f"lambda {step:g}", self.retrain_params)
            receipt = self.verification(
                row, None, "interpolation", warnings=(), params=params, measure_limit=False
            )
            flags = [
                c.title
                for c in receipt.checks
                if c.aspect == "influence" and c.verdict == "fail" and NO_LIMIT_CODE not in c.codes
            ]
            measured[f"{step:g}"] = flags
            if not flags:
                below = step
                break
            smallest = step
        self._limit = {
            "lambda": smallest,
            "by": measured.get(f"{smallest:g}", []) if smallest is not None else [],
            "not_flagged_at": below,
            "clean": name,
            "measured": measured,
        }
        if why:  # its flags say "shaped by the clients", not how much (HELD_OUT_LIMIT)
            self._limit["not_counted"] = {"client-level membership": why}
        if smallest is None:
            self._limit["reason"] = why or "the receipt does not flag the original itself"
        return self._limit

    def verify(self, result: UnlearnResult) -> UnlearnResult:
        """Return ``result`` with its receipt attached (``result.verification``)."""
        row = self.judge.judge(result, self.retrain_params)
        receipt = self.verification(
            row, result.details, result.method, lineage=result.lineage, params=result.params
        )
        return replace(result, verification=receipt)

    def audit(
        self,
        params: torch.Tensor,
        subject: str = "model",
        *,
        warnings: Iterable[str] | None = None,
        lineage: Lineage | None = None,
        assumptions: Iterable[str] | None = None,
    ) -> tuple[dict[str, Any], Verification]:
        """Return the measures and the receipt of any model of the run's architecture.

        Args:
            params: The model's flat parameters (``fedunlearn.models.get_flat_params`` order).
            subject: What the model is (shown on the receipt), e.g. its file name.
            warnings: The method's warnings, from its result file; None: none were available.
            lineage: The result's lineage, from its result file; None: no lineage.
            assumptions: What the result rests on (its details' ``assumptions``), from its
                result file; None: none stated.

        Raises:
            ConfigError: if ``params`` is not a flat vector of the run's model size.
        """
        expected = self.run.final_params.numel()
        if params.ndim != 1 or params.numel() != expected:
            raise ConfigError(
                f"the model has {params.numel()} parameters in shape {tuple(params.shape)}; this "
                f"run's {self.run.config.model.name} has {expected} (a flat vector). Audit a "
                "model of the run's architecture."
            )
        flat = params.detach().to(torch.float32)
        row = self.judge.measure(flat, subject, self.retrain_params)
        receipt = self.verification(
            row,
            None,
            subject,
            lineage=lineage,
            warnings=warnings,
            params=flat,
            assumptions=assumptions,
        )
        return row, receipt


def lineage_from_dict(data: Mapping[str, Any] | None) -> Lineage | None:
    """Return the ``Lineage`` a result file stored (``Lineage.to_dict()``), or None.

    Raises:
        ConfigError: if ``data`` is not a lineage record.
    """
    if data is None:
        return None
    if not isinstance(data, Mapping) or data.get("kind") not in ("exact", "approximate"):
        kind = data.get("kind") if isinstance(data, Mapping) else data
        raise ConfigError(
            f"the result's lineage kind {kind!r} is neither 'exact' nor 'approximate'"
        )
    try:
        return Lineage(
            kind=data["kind"],
            start=str(data["start"]),
            start_round=data.get("start_round"),
            first_tainted_round=data.get("first_tainted_round"),
            tainted_reads={str(k): list(v) for k, v in (data.get("tainted_reads") or {}).items()},
            reason=str(data.get("reason", "")),
        )
    except (KeyError, TypeError, AttributeError) as err:
        raise ConfigError(f"the result's lineage is not a lineage record: {err}") from None
