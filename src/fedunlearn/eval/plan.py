"""One way to issue receipts: options in, references measured once, receipts out.

``open_receipts(session, request, options)`` is the one place that decides what a request's
receipts are judged against and trains it (``measure_references``): Retrain when
``options.reference`` is ``retrain`` (a DP Retrain on a run trained with DP), the client-level
test's reference models (``options.client_test``) with the clean controls trained more and less
than Retrain, the distance band's independent retrains (``options.distance_retrains``). It
returns ``Receipts``, which judges any number of results or models of the request and states
each receipt's own cost (wall seconds, client epochs), apart from the method's.
``unlearn_one``, ``compare_methods`` and ``audit_model`` (``fedunlearn.experiments``) all call it.

A result whose lineage is ``exact`` is ``removed`` by construction: ``exact=True`` skips every
reference training (Retrain, the client-level test, the band, the membership attacks' shadow
models) and says so in the receipt's cost (``skipped``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from fedunlearn.errors import ConfigError
from fedunlearn.eval.distance_band import DistanceBand, measure_distance_band
from fedunlearn.eval.judge import Judge
from fedunlearn.eval.mia.client_lira import DEFAULT_MAX_SECONDS
from fedunlearn.eval.receipt import VerificationThresholds
from fedunlearn.eval.references import (
    CLIENT_TEST_REFERENCES,
    DEFAULT_CLIENT_TEST_REFERENCES,
    REFERENCES,
    ClientTest,
    clean_path,
    client_membership_check,
    continued_controls,
    reference_retrain,
)
from fedunlearn.eval.verifier import Verifier
from fedunlearn.unlearn import (
    UnlearnRequest,
    UnlearnResult,
    UnlearnSession,
    Verification,
    make_method,
)
from fedunlearn.unlearn.lineage import Lineage

__all__ = ["ReceiptOptions", "Receipts", "References", "measure_references", "open_receipts"]

NO_CONTROL_SKIP = (
    "every forgotten client was removed by an applied result: the run's current model carries "
    "none of their influence, so no reference gives a check power; none was trained"
)
EXACT_SKIP = (
    "the lineage is exact (removed by construction): no reference model was trained for this "
    "receipt"
)


@dataclass(frozen=True)
class ReceiptOptions:
    """What a request's receipts are judged against (the CLI's receipt options).

    Attributes:
        reference: ``original`` (judge against the original model only: the distance check is
            n/a) or ``retrain`` (train Retrain and judge against it too).
        thresholds: The rules' thresholds (defaults if None).
        client_test: Fit the client-level membership test (reference models with and without
            the forgotten clients) and judge each model with it.
        distance_retrains: With a Retrain reference, this many (>= 2) independent exact
            retrains set the distance check's band; 0 keeps the fixed ``distance_pass``.
        seed: Seed of the membership attacks, the references' batch orders and the noise.
        noise_std: Standard deviation of the noise of the second negative control.
        client_test_seconds: Wall-time budget of the client-level test's reference training
            (no round starts past it; with fewer than 2 references per side the test has no
            power and says so).
        client_test_references: ``held_out`` (the default: no reference trained; the null
            is the run's test examples, an honest exact Retrain the anchor:
            ``eval.mia.heldout``; built-in data split at random only, else it falls back to
            ``per_request`` and the receipt says why; it states no detection limit, so its
            pass alone is ``not_shown``, and misses a model tuned on the test set),
            ``per_request`` (the test's references trained for this request, about 8
            Retrains' client epochs; it states a limit) or ``shared`` (trained once per run
            generation on random halves of the clients, kept in the run directory and shared
            by every request until the next ``apply``: ``eval.mia.shared_references``).

    Raises:
        ConfigError: for an unknown reference or a band that cannot be measured.
    """

    reference: str = "original"
    thresholds: VerificationThresholds | None = None
    client_test: bool = True
    distance_retrains: int = 0
    seed: int = 0
    noise_std: float = 1e-3
    client_test_seconds: float = DEFAULT_MAX_SECONDS
    client_test_references: str = DEFAULT_CLIENT_TEST_REFERENCES

    def __post_init__(self) -> None:
        if self.client_test_references not in CLIENT_TEST_REFERENCES:
            raise ConfigError(
                f"client_test_references must be one of {', '.join(CLIENT_TEST_REFERENCES)}; "
                f"got {self.client_test_references!r}"
            )
        if self.reference not in REFERENCES:
            raise ConfigError(
                f"reference must be one of {', '.join(REFERENCES)}; got {self.reference!r}"
            )
        if self.distance_retrains == 1 or self.distance_retrains < 0:
            raise ConfigError(
                f"--distance-retrains must be 0 (the fixed pass line) or at least 2 (a measured "
                f"spread); got {self.distance_retrains}"
            )
        if self.distance_retrains and self.reference != "retrain":
            raise ConfigError(
                "--distance-retrains measures the band around Retrain: add --reference retrain"
            )


@dataclass(frozen=True)
class References:
    """What a request's receipts are judged against, and what training it cost.

    Attributes:
        retrain: The Retrain reference (None: judged against the original only).
        clean_path: Retrain's earlier global models (clean, less trained).
        continued: Retrain continued by the remaining clients (clean, trained more).
        client_test: The fitted client-level test, or None.
        distance_band: The band of independent exact retrains, or None.
        parts: What each reference cost: name -> ``{"wall_seconds", "client_epochs"}``.
        skipped: Why no reference was trained (an exact lineage), or None.
    """

    retrain: UnlearnResult | None = None
    clean_path: Mapping[str, torch.Tensor] = field(default_factory=dict)
    continued: Mapping[str, torch.Tensor] = field(default_factory=dict)
    client_test: ClientTest | None = None
    distance_band: DistanceBand | None = None
    parts: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    skipped: str | None = None

    def cost(self) -> dict[str, float]:
        """Wall seconds and client epochs of every reference trained."""
        return {
            "wall_seconds": sum(p["wall_seconds"] for p in self.parts.values()),
            "client_epochs": sum(p["client_epochs"] for p in self.parts.values()),
        }


def _cost(seconds: float, epochs: float) -> dict[str, float]:
    return {"wall_seconds": float(seconds), "client_epochs": float(epochs)}


def _is_dp_run(session: UnlearnSession) -> bool:
    dp = session.run_view.config.privacy
    return bool(dp.enabled and dp.dp_scope == "train_and_store")


def _judged_retrain(
    session: UnlearnSession,
    request: UnlearnRequest,
    retrain: UnlearnResult | None,
    progress: Callable[[dict[str, float]], None] | None,
) -> tuple[UnlearnResult, bool]:
    """Retrain to judge against (DP Retrain on a DP run); whether it was trained here."""
    if retrain is not None and not _is_dp_run(session):
        return retrain, False
    trained = reference_retrain(session, request, "retrain", progress=progress)
    assert trained is not None
    return trained, True


def _band(
    session: UnlearnSession,
    request: UnlearnRequest,
    options: ReceiptOptions,
    judged: UnlearnResult | None,
    parts: dict[str, dict[str, float]],
) -> DistanceBand | None:
    """The distance band of ``options.distance_retrains`` independent retrains (its cost)."""
    if not options.distance_retrains or judged is None:
        return None
    band = measure_distance_band(
        session, request, judged, count=options.distance_retrains, seed=options.seed
    )
    if band is not None:
        parts["distance band"] = _cost(band.cost_seconds, band.cost_client_epochs)
    return band


def measure_references(
    session: UnlearnSession,
    request: UnlearnRequest,
    options: ReceiptOptions,
    *,
    retrain: UnlearnResult | None = None,
    retrain_path: Mapping[str, torch.Tensor] | None = None,
    exact: bool = False,
    progress: Callable[[dict[str, float]], None] | None = None,
    step: Callable[[str], None] | None = None,
) -> References:
    """Train what the receipts of ``request`` are judged against (the only training they do).

    Args:
        session: The opened run.
        request: The clients removed.
        options: What to judge against.
        retrain: A Retrain of the request computed already (``compare`` runs it as a
            method): not trained again, not counted as the receipt's cost.
        retrain_path: Its earlier global models, when its trajectory was dropped.
        exact: The result's lineage is exact: train nothing (``References.skipped``).
        progress: Told about the reference Retrain's rounds.
        step: Told which shared reference of the client-level test trains.
    """
    if exact:
        return References(skipped=EXACT_SKIP)
    if request.forget and request.forget <= session.run_view.applied:
        return References(skipped=NO_CONTROL_SKIP)
    parts: dict[str, dict[str, float]] = {}
    judged, path = None, dict(retrain_path or {})
    if options.reference == "retrain":
        judged, trained = _judged_retrain(session, request, retrain, progress)
        if trained:
            parts["retrain"] = _cost(judged.costs.elapsed_seconds, judged.costs.client_epochs)
            path = {}
        path = path or clean_path(judged)
    base = retrain if retrain is not None else judged  # the plain Retrain, for the client test
    # the client-level test asks about whole clients: a sample-level request has none to test
    client_test = options.client_test and bool(request.forget)
    if client_test and base is None:
        base = session.run(make_method("retrain"), request)
        parts["retrain (client test)"] = _cost(base.costs.elapsed_seconds, base.costs.client_epochs)
    continued: dict[str, torch.Tensor] = {}
    malicious = session.run_view.malicious
    others_remain = bool(malicious - request.forget) and bool(malicious & request.forget)
    if base is not None and (client_test or others_remain):
        # clean models trained more than Retrain: the client test's score growth, and the
        # growth of the remaining attackers' backdoor (eval.receipt.fitness)
        continued, seconds, epochs = continued_controls(session, request, base)
        parts["continued controls"] = _cost(seconds, epochs)
    test = None
    if client_test and base is not None:
        test = client_membership_check(
            session,
            request,
            base,
            seed=options.seed,
            max_seconds=options.client_test_seconds,
            path=dict(retrain_path) if retrain is not None and retrain_path else clean_path(base),
            continued=continued,
            references=options.client_test_references,
            step=step,
            anchor_given=retrain is not None,
        )
        parts["client test"] = _cost(test.cost_seconds, test.cost_client_epochs)
    band = _band(session, request, options, judged, parts)
    return References(judged, path, continued, test, band, parts)


class Receipts:
    """The receipts of one request: references measured once, then any number of models.

    Args:
        session: The opened run.
        request: The clients removed.
        options: What the receipts are judged against.
        references: What ``measure_references`` trained.
        judge: A ``Judge`` of this session and request to reuse.
    """

    def __init__(
        self,
        session: UnlearnSession,
        request: UnlearnRequest,
        options: ReceiptOptions,
        references: References,
        *,
        judge: Judge | None = None,
    ) -> None:
        began = time.perf_counter()
        self.options = options
        self.references = references
        self.verifier = Verifier(
            session,
            request,
            thresholds=options.thresholds,
            retrain=references.retrain,
            seed=options.seed,
            judge=judge,
            noise_std=options.noise_std,
            client_membership=references.client_test,
            distance_band=references.distance_band,
            clean_path_models=references.clean_path,
            continued_models=references.continued,
            attacks=references.skipped is None,
        )
        self._setup_seconds = time.perf_counter() - began

    def cost(self, seconds: float, shared_by: int = 1) -> dict[str, Any]:
        """The receipt's own cost: its references (shared) plus ``seconds`` of judging.

        ``wall_seconds``: all of it; ``judging_seconds``: this model's measures and checks
        alone (``shared_seconds`` the references and setup, shared by ``shared_by`` receipts).
        """
        refs = self.references.cost()
        shared = refs["wall_seconds"] + self._setup_seconds
        out: dict[str, Any] = {
            "wall_seconds": shared + seconds,
            "judging_seconds": seconds,
            "shared_seconds": shared,
            "client_epochs": refs["client_epochs"],
            "references": {k: dict(v) for k, v in self.references.parts.items()},
            "shared_by": shared_by,
        }
        if self.references.skipped:
            out["skipped"] = self.references.skipped
        test = self.references.client_test
        if test is not None and test.shared is not None:
            # the client test's shared references: paid by the request that trained them
            out["client_test_shared"] = dict(test.shared)
        return out

    def verify(self, result: UnlearnResult, *, shared_by: int = 1) -> UnlearnResult:
        """Return ``result`` with its receipt (and the receipt's cost) attached."""
        began = time.perf_counter()
        verified = self.verifier.verify(result)
        assert verified.verification is not None
        cost = self.cost(time.perf_counter() - began, shared_by)
        return replace(verified, verification=replace(verified.verification, cost=cost))

    def receipt(
        self,
        row: dict[str, Any],
        result: UnlearnResult,
        *,
        shared_by: int = 1,
        measured_seconds: float = 0.0,
    ) -> Verification:
        """The receipt of ``result`` whose row the caller measured (``compare``'s table row).

        ``measured_seconds``: what measuring the row took (the receipt's time, too).
        """
        began = time.perf_counter()
        receipt = self.verifier.verification(
            row, result.details, result.method, lineage=result.lineage, params=result.params
        )
        seconds = measured_seconds + time.perf_counter() - began
        return replace(receipt, cost=self.cost(seconds, shared_by))

    def audit(
        self,
        params: torch.Tensor,
        subject: str,
        *,
        warnings: Iterable[str] | None = None,
        lineage: Lineage | None = None,
        assumptions: Iterable[str] | None = None,
    ) -> tuple[dict[str, Any], Verification]:
        """The measures and the receipt of any model of the run's architecture."""
        began = time.perf_counter()
        row, receipt = self.verifier.audit(
            params, subject, warnings=warnings, lineage=lineage, assumptions=assumptions
        )
        return row, replace(receipt, cost=self.cost(time.perf_counter() - began))


def open_receipts(
    session: UnlearnSession,
    request: UnlearnRequest,
    options: ReceiptOptions,
    *,
    judge: Judge | None = None,
    **measure: Any,
) -> Receipts:
    """Measure the references of ``request`` and return its ``Receipts`` (the one assembly).

    ``measure``: ``retrain``, ``retrain_path``, ``exact``, ``progress`` and ``step`` of
    ``measure_references``.
    """
    references = measure_references(session, request, options, **measure)
    return Receipts(session, request, options, references, judge=judge)
