"""Issue receipts: verify unlearned models of one run against one request.

``Verifier(session, request, retrain=...)`` measures once what every receipt of the request
shares: the membership attack (``Judge``), the rows of the controls (the original model, the
original plus small Gaussian noise, Retrain's when a Retrain result is given; their
participation-marker rates when a forgotten client embedded a marker), the clean backdoor
ASR of the initial model M_0, ``||M_0 - Retrain||`` (a bound at least this large is vacuous) and
the store's deletion evidence. Retrain is never run here: compute it first
(``reference_retrain(session, request, "retrain")`` or ``session.run(make_method("retrain"),
request)``) and pass it in. Then ``verify(result)`` returns the result with its ``verification``
attached, and ``audit(params)`` gives the receipt of any model of the run's architecture,
including one trained or edited outside the toolkit. The checks and their thresholds:
``fedunlearn.eval.checks`` and docs/verification.md.

Example::

    with UnlearnSession("runs/demo") as session:
        request = UnlearnRequest.of(sorted(session.run_view.malicious), "recover")
        retrain = reference_retrain(session, request, "retrain")
        verifier = Verifier(session, request, retrain=retrain)
        result = verifier.verify(session.run(make_method("crab"), request))
        print(result.verification.verdict)
        for reason in result.verification.reasons:
            print(reason)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

import torch

from fedunlearn.errors import ConfigError, ForgottenDataError, HistoryError
from fedunlearn.eval.checks import Evidence, VerificationThresholds, build_verification
from fedunlearn.eval.distance import l2_distance
from fedunlearn.eval.distance_band import DistanceBand, measure_distance_band
from fedunlearn.eval.judge import Judge
from fedunlearn.eval.markers import MarkerEvidence, MarkerProbe
from fedunlearn.eval.mia.client import ClientMembershipEvidence
from fedunlearn.history.store import HistoryStore
from fedunlearn.history.store.reconstruction import reconstructible_updates
from fedunlearn.privacy.reference import with_run_mechanism
from fedunlearn.unlearn import (
    Details,
    UnlearnRequest,
    UnlearnResult,
    UnlearnSession,
    Verification,
    make_method,
)
from fedunlearn.unlearn.lineage import Lineage

__all__ = [
    "REFERENCES",
    "DPRetrainDetails",
    "Verifier",
    "clean_path",
    "client_membership_check",
    "deletion_evidence",
    "lineage_from_dict",
    "reference_retrain",
]

REFERENCES = ("original", "retrain")
#: The receipt's DP Retrain reference draws its noise and batches under this name
#: (``UnlearnContext.release_noise_salt``): never the run's rounds' draws, nor a release's.
REFERENCE_SALT = "receipt_reference"


def reference_retrain(
    session: UnlearnSession,
    request: UnlearnRequest,
    reference: str,
    *,
    progress: Callable[[dict[str, float]], None] | None = None,
) -> UnlearnResult | None:
    """Return the Retrain result a ``reference`` asks for: run it for ``retrain``, else None.

    On a run trained with DP (``dp_scope: train_and_store``) Retrain trains under the run's
    own mechanism at ε_max per round (``fedunlearn.privacy.reference``), with noise and
    batches of its own (``REFERENCE_SALT``): a DP Retrain, whose ``details`` are
    ``DPRetrainDetails``; a DP method is then judged against the same noise level, not the
    same draws. Other runs: the plain Retrain.

    Args:
        session: The opened run.
        request: The clients to remove.
        reference: ``"original"`` (judge against the original model only: the distance check is
            n/a) or ``"retrain"`` (run Retrain now, to judge against it too).
        progress: Passed to ``session.run`` while Retrain runs.

    Raises:
        ConfigError: for an unknown ``reference``.
    """
    if reference not in REFERENCES:
        raise ConfigError(f"reference must be one of {', '.join(REFERENCES)}; got {reference!r}")
    if reference == "original":
        return None
    run = session.run_view
    private = with_run_mechanism(  # a DP run's reference: DP Retrain (None: no DP in training)
        session.federation,
        run.config.privacy,
        run.store.round_scalars,
        seed=run.config.seed,
        clip_norm=session.release_clip_norm(request),
        # noise and batches of its own: never the run's rounds' nor a release's (issue 40)
        noise_salt=session.context(request).release_noise_salt(REFERENCE_SALT, request.forget),
    )
    if private is None:
        return session.run(make_method("retrain"), request, progress=progress)
    try:
        context = session.context(request, progress=progress, clients=private)
        result = make_method("retrain").unlearn(request, context)
    finally:
        private.close()
    return replace(result, details=DPRetrainDetails(run.config.privacy.mechanism))


@dataclasses.dataclass(frozen=True)
class DPRetrainDetails(Details):
    """A Retrain reference trained under the run's DP mechanism (``privacy.reference``).

    Attributes:
        mechanism: The run's ``privacy.mechanism``.
        private: Always True (the receipt's utility check reads it).
        note: The budgets used.
    """

    mechanism: str
    private: bool = True
    note: str = "each round at ε_max, the release clip norm, noise and batches of its own"


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
      failure) and ``attempted``;
    - ``page_scan``: ``{"ran", "fragments_found", "inconclusive_reason"}``: the page scan of
      the database file and its WAL (``HistoryStore.check_deletions``), always run, for the
      recorded deletions, the models ``forget()`` dropped and every update of these clients
      that went without a deletion record (raw SQL); ``fragments_found`` counts the
      overflow-page fingerprints of such payloads still in the files; plus ``unrecorded``
      ([round, client] deleted outside ``forget()``), ``problems`` and ``pages_scanned``;
    - ``scan``: ``{"ok", "reason"}``, ``ok`` False when fragments were found or a deleted
      payload is readable;
    - ``reconstructible``: [round, client] of each deleted update the store can still rebuild
      (``history.store.reconstruction.reconstructible_updates``: aggregate or consecutive
      global models minus the other clients' stored updates).

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
    scan = store.check_deletions(clients)
    page_scan = {
        "ran": True,
        "fragments_found": scan.fingerprints_found,
        "fingerprints_checked": scan.fingerprints_checked,
        "pages_scanned": scan.pages_scanned,
        "unrecorded": [list(p) for p in scan.unrecorded],
        "problems": list(scan.problems),
        "inconclusive_reason": scan.inconclusive_reason,
    }
    return {
        "clients": clients,
        "bytes_held": held,
        "payloads_held": payloads_held,
        "records": records,
        "read_back": read_back,
        "page_scan": page_scan,
        "scan": {
            "ok": scan.fingerprints_found == 0 and scan.unreadable == scan.payloads_checked,
            "reason": "; ".join(p for p in scan.problems[:3] if "live payloads" not in p) or None,
        },
        "reconstructible": reconstructible_updates(store, clients),
    }


def _method_warnings(details: Details | None, name: str = "warnings") -> tuple[str, ...]:
    """The sentences of a details field (``warnings``, ``assumptions``) as a tuple."""
    found = getattr(details, name, ()) if details is not None else ()
    if isinstance(found, str):
        return (found,)
    return tuple(str(w) for w in found or ())


CONTINUED_ROUNDS = 5  # rounds the clean control trains beyond Retrain
CLEAN_PATH_POINTS = 6  # Retrain's earlier global models kept as clean, less-trained controls


def clean_path(retrain: UnlearnResult | None) -> dict[str, torch.Tensor]:
    """Return clean models less trained than Retrain: its own earlier global models.

    Retrain's trajectory holds the global model after each of its L rounds; the receipt keeps
    those after rounds 1 and about L/6, 2L/6, ... 5L/6 (``clean_round_<t>``), clean by
    construction, from barely trained to nearly Retrain. A model less trained than every
    reference model of the client-level test is compared with them (``fedunlearn.eval.checks``):
    an under-trained clean model can have a high backdoor ASR, marker rate or membership score
    of its own. Empty without Retrain or its trajectory.
    """
    if retrain is None or retrain.trajectory is None:
        return {}
    rounds = retrain.trajectory.rounds
    total = len(rounds)
    picks = {max(1, round(total * i / CLEAN_PATH_POINTS)) for i in range(CLEAN_PATH_POINTS)}
    return {
        f"clean_round_{t}": rounds[t - 1].global_model.detach().to(torch.float32)
        for t in sorted(picks - {total})
        if rounds[t - 1].global_model is not None
    }


def client_membership_check(
    session: UnlearnSession,
    request: UnlearnRequest,
    retrain: UnlearnResult | None = None,
    *,
    seed: int = 0,
    path: Mapping[str, torch.Tensor] | None = None,
) -> Callable[[torch.Tensor], ClientMembershipEvidence]:
    """Fit the client-level membership test of ``request`` once; return the receipt's check input.

    Trains the test's reference models (``eval.mia.fit_client_membership``: with and without
    the forgotten clients, its cost bounded by its ``max_seconds``; it also measures their
    fitness range, within which its threshold is valid) and clean controls off Retrain's
    path: Retrain (``retrain``, or one trained here) continued for 1 to ``CONTINUED_ROUNDS``
    FedAvg rounds of the remaining clients (new round seeds; ``retrain_continued_k``). A model
    trained longer is more confident on every example, the forgotten clients' too; with their
    fitness these controls trace how a clean model's score grows with training, and a model is
    compared with the clean controls no more trained than it (``check_client_membership``).
    Retrain's earlier global models (``clean_path``; ``path`` when the caller kept them and
    dropped Retrain's trajectory) are scored too: the clean models less trained than the
    references. Returns the function ``Verifier(client_membership=...)``
    calls per model: the candidate scored beside the original (negative control), ``retrain``
    and the continued controls (scoring Retrain also places the "without" references between
    Retrain and the original, for the distance check).
    """
    from fedunlearn.eval.mia import fit_client_membership
    from fedunlearn.fl.engine import run_rounds
    from fedunlearn.unlearn import make_method

    test = fit_client_membership(session, sorted(request.forget), seed=seed)
    original = session.run_view.final_params
    base = retrain if retrain is not None else session.run(make_method("retrain"), request)
    context = session.context(request)
    rounds = session.run_view.num_rounds  # the store's last round (an applied or continued run)
    continued: dict[str, torch.Tensor] = {}
    params = base.params
    for extra in range(1, CONTINUED_ROUNDS + 1):
        params = run_rounds(
            context.clients,
            context.aggregator,
            params,
            num_rounds=rounds + extra,
            start_round=rounds + extra,
            participation=context.training.participation,
        )
        continued[f"retrain_continued_{extra}"] = params
    path = dict(clean_path(base) if path is None else path)

    def evidence(params: torch.Tensor) -> ClientMembershipEvidence:
        # clean controls: Retrain (given, or trained here), Retrain continued (more trained)
        # and Retrain's earlier global models (less trained)
        models = {
            "original": original,
            "candidate": params,
            "retrain": base.params,
            **continued,
            **path,
        }
        return test.evidence(models)

    return evidence


class Verifier:
    """Issues the receipt of models of one run for one request.

    Args:
        session: The opened run.
        request: The clients removed (and why: ``forget`` or ``recover``).
        thresholds: The checks' thresholds (defaults if None).
        retrain: Retrain's result for this request (``reference_retrain``), to judge against
            it too; None judges against the original model and fixed fallbacks (the distance
            check is n/a).
        seed: Seed of the membership attacks.
        judge: A ``Judge`` of this session and request to reuse (its attack is fitted once);
            it keeps no state of this verifier.
        noise_std: Standard deviation of the Gaussian noise added to the original model for
            the second negative control (0 skips it).
        client_membership: The client-level membership test of this request, as a function of
            a model's flat parameters returning ``ClientMembershipEvidence`` whose ``scores``
            include ``candidate`` (and ``original``, ``retrain``); None: the check is n/a.
        distance_retrains: Independent exact retrains (other batch orders) to train for the
            distance check's band (``eval.distance_band``; each costs one Retrain); 0 keeps the
            fixed ``distance_pass``. Needs ``retrain``; at least 2 when not 0.
        distance_band: A band measured before (e.g. shared by several verifiers of one
            request); overrides ``distance_retrains``.
        clean_path_models: Retrain's earlier global models (``clean_path``), when the caller
            kept them and dropped ``retrain``'s trajectory; None takes them from ``retrain``.

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
        distance_retrains: int = 0,
        distance_band: DistanceBand | None = None,
        clean_path_models: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        if distance_retrains == 1 or distance_retrains < 0:
            raise ConfigError(
                f"distance_retrains must be 0 (fixed pass line) or at least 2 (a measured "
                f"spread); got {distance_retrains}"
            )
        if retrain is not None and retrain.method != "retrain":
            raise ConfigError(f"retrain must be a result of 'retrain'; got '{retrain.method}'")
        run = session.run_view
        run.check_request(request)
        self.run = run
        self.request = request
        self.thresholds = thresholds or VerificationThresholds()
        self.judge = judge or Judge(run, session.evaluation, request, seed)
        self.retrain = retrain
        self.retrain_params = retrain.params if retrain is not None else None
        self.retrain_row: dict[str, Any] | None = None
        self.retrain_gap: float | None = None
        if retrain is not None:
            self.retrain_row = self.judge.judge(retrain, self.retrain_params)
            self.retrain_gap = l2_distance(run.final_params, retrain.params)
        self.original_row = self.judge.measure(run.final_params, "original", self.retrain_params)
        self.noise_std = noise_std
        self.noisy_original_row: dict[str, Any] | None = None
        noisy = None
        if noise_std > 0:
            g = torch.Generator().manual_seed(seed)
            noise = torch.randn(run.final_params.shape, generator=g) * noise_std
            noisy = run.final_params + noise
            self.noisy_original_row = self.judge.measure(
                noisy, "original + noise", self.retrain_params
            )
        # participation markers of the forgotten clients: their controls' rates, measured once
        self.marker_probe = MarkerProbe(session.evaluation, request)
        self._marker_controls: dict[str, tuple[dict, dict]] = {}
        if self.marker_probe:
            self._marker_controls["original"] = self.marker_probe.rates(run.final_params)
            if noisy is not None:
                self._marker_controls["original + noise"] = self.marker_probe.rates(noisy)
            if retrain is not None:
                self._marker_controls["retrain"] = self.marker_probe.rates(retrain.params)
        # Retrain's earlier global models: clean, less trained controls (``clean_path``)
        path = clean_path(retrain) if clean_path_models is None else dict(clean_path_models)
        self.clean_path_rows: dict[str, dict[str, Any]] = {}
        if session.evaluation.trigger is not None or run.malicious:  # backdoor, poisoning
            self.clean_path_rows = {
                label: dict(session.evaluation.evaluate(params)) for label, params in path.items()
            }
        if self.marker_probe:
            for label, params in path.items():
                self._marker_controls[label] = self.marker_probe.rates(params)
        self.distance_band = distance_band
        if distance_band is None and distance_retrains and retrain is not None:
            self.distance_band = measure_distance_band(
                session, request, retrain, count=distance_retrains, seed=seed
            )
        self.initial_gap = (
            l2_distance(run.initial_params, retrain.params) if retrain is not None else None
        )
        self.clean_asr = None
        if session.evaluation.trigger is not None:
            self.clean_asr = session.evaluation.evaluate(run.initial_params).get("backdoor_asr")
        self.client_membership = client_membership
        self.deletion = deletion_evidence(run.store, request.forget)
        malicious = run.malicious
        self._attack = {
            "backdoor": session.evaluation.trigger is not None,
            "attackers_forgotten": len(malicious & request.forget),
            # an earlier client an applied result removed is not in the current model (the
            # checks' control): it cannot make the backdoor check's pass indecisive
            "clients_forgotten": len(request.forget - run.applied),
            "attackers_total": len(malicious),
            "attack_kind": run.config.attack.kind if malicious else None,
            "private_run": bool(run.config.privacy.enabled),
            "private_reference": bool(
                retrain is not None and getattr(retrain.details, "private", False)
            ),
        }

    @property
    def references(self) -> tuple[str, ...]:
        """The reference models in use."""
        return ("original", "retrain") if self.retrain is not None else ("original",)

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
        """Return the checks' evidence for a model's row (from this verifier's ``judge``).

        ``warnings`` overrides the details' warnings (an audit's ``--result``); with neither
        details nor warnings, the receipt says that none were available. ``assumptions``
        likewise overrides the details' assumptions.
        """
        found = _method_warnings(details) if warnings is None else tuple(warnings)
        assumed = (
            _method_warnings(details, "assumptions") if assumptions is None else tuple(assumptions)
        )
        return Evidence(
            row=row,
            original=self.original_row,
            retrain=self.retrain_row,
            retrain_gap=self.retrain_gap,
            request_kind=self.request.kind,
            bound=details.certified_bound() if details is not None else None,
            warnings=found,
            assumptions=assumed,
            deletion=self.deletion,
            noisy_original=self.noisy_original_row,
            noise_std=self.noise_std if self.noisy_original_row is not None else None,
            clean_asr=self.clean_asr,
            initial_gap=self.initial_gap,
            client_membership=client_membership,
            warnings_available=details is not None or warnings is not None,
            lineage=lineage,
            markers=markers,
            distance_band=self.distance_band if self.retrain is not None else None,
            clean_path=self.clean_path_rows,
            **self._attack,
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
    ) -> Verification:
        """Return the receipt of a model from its row (``judge.judge`` or ``judge.measure``).

        ``params`` (the model's flat parameters) feed the client-level membership test when
        the verifier has one, and the participation markers of the forgotten clients.
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
        return build_verification(evidence, self.thresholds, subject=subject)

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
