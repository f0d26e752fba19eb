"""The receipt's reference models, trained here and nowhere else.

Everything a receipt trains beside the method is in this module, so its cost is counted in one
place (``fedunlearn.eval.plan.measure_references`` adds it up):

- ``reference_retrain``: Retrain of the request (a DP Retrain on a run trained with DP);
- ``clean_path``: Retrain's own earlier global models, clean models less trained than it
  (free: they come with its trajectory);
- ``continued_controls``: Retrain continued 1 to ``CONTINUED_ROUNDS`` FedAvg rounds by the
  remaining clients, clean models trained more than it;
- ``client_membership_check``: the client-level membership test's reference models (with and
  without the forgotten clients), fitted once per request;
- the distance band's independent exact retrains (``eval.distance_band``).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch

from fedunlearn.errors import ConfigError
from fedunlearn.eval.mia.client import ClientMembershipEvidence
from fedunlearn.privacy.reference import with_run_mechanism
from fedunlearn.unlearn import (
    Details,
    UnlearnRequest,
    UnlearnResult,
    UnlearnSession,
    make_method,
)

__all__ = [
    "CLEAN_PATH_POINTS",
    "CLIENT_TEST_REFERENCES",
    "CONTINUED_ROUNDS",
    "REFERENCES",
    "ClientTest",
    "DPRetrainDetails",
    "clean_path",
    "client_membership_check",
    "continued_controls",
    "reference_retrain",
    "retrain_from_another_start",
]

REFERENCES = ("original", "retrain")
#: Where the client-level test's references come from: trained for each request, or once per
#: run generation and shared by its requests (``eval.mia.shared_references``), or none: a null
#: from the run's held-out test examples (``eval.mia.heldout``).
CLIENT_TEST_REFERENCES = ("per_request", "shared", "held_out")
#: The receipt's client-level null by default (``ReceiptOptions``): the held-out test set (no
#: reference trained), which falls back to the per-request references where the split gives no
#: such null and says why (docs/verification.md, "Held-out null"; calibration and cost there and
#: in docs/performance.md). ``client_membership_check`` itself fits what it is asked for.
DEFAULT_CLIENT_TEST_REFERENCES = "held_out"
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


CONTINUED_ROUNDS = 5  # rounds the clean control trains beyond Retrain
#: Why a receipt with the held-out client test states no detection limit (docs/verification.md)
HELD_OUT_LIMIT = (
    "not measured: the held-out client test is anchored on Retrain, so steps from Retrain or "
    "its continuations understate what it misses in a model off Retrain's own line"
)
CLEAN_PATH_POINTS = 6  # Retrain's earlier global models kept as clean, less-trained controls


def clean_path(retrain: UnlearnResult | None) -> dict[str, torch.Tensor]:
    """Return clean models less trained than Retrain: its own earlier global models.

    Retrain's trajectory holds the global model after each of its L rounds; the receipt keeps
    those after rounds 1 and about L/6, 2L/6, ... 5L/6 (``clean_round_<t>``), clean by
    construction, from barely trained to nearly Retrain. A model less trained than every
    reference model of the client-level test is compared with them
    (``fedunlearn.eval.receipt.fitness``): an under-trained clean model can have a high
    backdoor ASR, marker rate or membership score of its own. Empty without Retrain or its
    trajectory.
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


def continued_controls(
    session: UnlearnSession, request: UnlearnRequest, base: UnlearnResult
) -> tuple[dict[str, torch.Tensor], float, float]:
    """Return Retrain continued 1 to ``CONTINUED_ROUNDS`` rounds, with their cost.

    FedAvg rounds of the remaining clients (new round seeds) from ``base`` (Retrain):
    ``retrain_continued_k``. A model trained longer is more confident on every example and,
    with attackers left in the federation, carries more of their backdoor; these clean
    controls trace how much training alone adds (``eval.receipt.fitness``).

    Returns:
        The models by label, the wall seconds and the client epochs spent.
    """
    from fedunlearn.fl.engine import run_rounds

    started = time.perf_counter()
    context = session.context(request)
    rounds = session.run_view.num_rounds  # the store's last round (an applied or continued run)
    out: dict[str, torch.Tensor] = {}
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
        out[f"retrain_continued_{extra}"] = params
    return out, time.perf_counter() - started, float(context.meter.costs.client_epochs)


@dataclasses.dataclass(frozen=True)
class ClientTest:
    """The client-level test of one request, fitted: call it with a model's flat parameters.

    Attributes:
        score: ``models -> ClientMembershipEvidence`` of the fitted test.
        original: The original model's parameters (the negative control, scored each time).
        controls: The clean controls scored beside every model (Retrain, continued, path).
        cost_seconds: Wall seconds of the fit (references; a Retrain trained for it).
        cost_client_epochs: Client epochs of the same.
        shared: With shared references, their one-time cost and whether this request read
            them from the run directory (``cached``); None with per-request references.
        limit_reason: Why the receipt states no detection limit, or None (it is measured).
    """

    score: Callable[[Mapping[str, torch.Tensor]], ClientMembershipEvidence]
    original: torch.Tensor
    controls: Mapping[str, torch.Tensor]
    cost_seconds: float
    cost_client_epochs: float
    shared: Mapping[str, object] | None = None
    limit_reason: str | None = None

    def __call__(self, params: torch.Tensor) -> ClientMembershipEvidence:
        """Score ``params`` (the candidate) beside the original and the clean controls."""
        return self.score({"original": self.original, "candidate": params, **self.controls})


def client_membership_check(
    session: UnlearnSession,
    request: UnlearnRequest,
    retrain: UnlearnResult | None = None,
    *,
    seed: int = 0,
    max_seconds: float | None = None,
    path: Mapping[str, torch.Tensor] | None = None,
    continued: Mapping[str, torch.Tensor] | None = None,
    references: str = "per_request",
    step: Callable[[str], None] | None = None,
    anchor_given: bool = False,
) -> ClientTest:
    """Fit the client-level membership test of ``request`` once; return the receipt's input.

    Trains the test's reference models (``eval.mia.fit_client_membership``: with and without
    the forgotten clients, its cost bounded by its ``max_seconds``; it also measures their
    fitness range, within which its threshold is valid). Each model is scored beside the
    original (negative control), Retrain (``retrain``, or one trained here), the clean controls
    trained more (``continued``, else ``continued_controls`` trains them) and less (Retrain's
    earlier global models: ``clean_path``, or ``path`` when the caller kept them and dropped
    Retrain's trajectory); with their fitness they trace how a clean model's score grows with
    training (``eval.receipt.rules.client_membership``). Scoring Retrain also places the
    "without" references between Retrain and the original, for the distance check.

    ``references="shared"`` calibrates on the run generation's shared references
    (``eval.mia.shared_references``: trained by the first request, read from the run directory
    by the later ones), and falls back to the per-request references for a request the shared
    set cannot test; ``step`` is told which shared reference trains. ``references="held_out"``
    trains no reference: its null is the run's test examples, Retrain its anchor
    (``eval.mia.heldout``); where the split gives no such null (``heldout.exchangeable``) it
    falls back to the per-request references and says why in the test's ``notes["held_out"]``
    (the reason alone in ``notes["held_out_fallback"]``, which the receipt quotes).
    ``anchor_given``: ``retrain`` came from the caller, not trained by the receipt (the
    held-out test's anchor is then only as honest as the caller: ``notes["anchor_given"]``).

    Returns:
        The fitted test: ``Verifier(client_membership=...)`` calls it per model, and its
        cost (the references, plus a Retrain and its continued controls when trained here).
    """
    from fedunlearn.eval.mia import fit_client_membership
    from fedunlearn.eval.mia.heldout import held_out_client_test
    from fedunlearn.eval.mia.shared_references import shared_client_test

    if references not in CLIENT_TEST_REFERENCES:
        raise ConfigError(
            f"client-test references must be one of {', '.join(CLIENT_TEST_REFERENCES)}; got "
            f"{references!r}"
        )
    started = time.perf_counter()
    budget: dict[str, Any] = {} if max_seconds is None else {"max_seconds": max_seconds}
    epochs = 0.0
    base = retrain
    if base is None and references == "held_out":  # its anchor (otherwise trained after)
        base = session.run(make_method("retrain"), request)
        epochs += base.costs.client_epochs
    test: Any = None
    why = ""
    if base is not None and references == "held_out":
        test, why = held_out_client_test(session, sorted(request.forget), base.params)
    if references == "shared":
        test = shared_client_test(session, sorted(request.forget), seed=seed, step=step, **budget)
    if test is None:
        test = fit_client_membership(session, sorted(request.forget), seed=seed, **budget)
        if why:
            test.notes["held_out"] = f"not applicable ({why}): references trained per request"
            test.notes["held_out_fallback"] = why
    elif references == "held_out":
        test.notes["anchor_given"] = anchor_given and retrain is not None
    epochs += float(test.cost_client_epochs)
    if base is None:
        base = session.run(make_method("retrain"), request)
        epochs += base.costs.client_epochs
    if continued is None:
        continued, _, more = continued_controls(session, request, base)
        epochs += more
    controls = {"retrain": base.params, **continued}
    controls.update(clean_path(base) if path is None else path)
    return ClientTest(
        test.evidence,
        session.run_view.final_params,
        controls,
        time.perf_counter() - started,
        epochs,
        test.notes.get("shared_references"),  # type: ignore[arg-type]
        HELD_OUT_LIMIT if test.notes.get("references") == "held_out" else None,
    )


def retrain_from_another_start(
    session: UnlearnSession, request: UnlearnRequest, seed: int
) -> torch.Tensor:
    """Return a Retrain of ``request`` from another initial model (a clean model, not M_0's).

    The run's model re-initialised with ``seed`` (every module's ``reset_parameters``), trained
    like the client-level test's "without" references (the run's rounds and participants,
    other batch orders). A calibration control: it never saw the forgotten clients, and it
    does not share the references' start (``ClientMembershipEvidence.ground``).
    """
    from fedunlearn.eval.mia.client_lira import (
        _Budget,
        _run_participants,
        _SaltedClients,
        _train_reference,
    )
    from fedunlearn.fl.seeding import derive_seed
    from fedunlearn.models.flat import get_flat_params

    model = copy.deepcopy(session.run_view.model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "another M_0"))
        for module in model.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
    trained = _train_reference(
        _SaltedClients(session.federation, derive_seed(seed, "another M_0 batches")),
        get_flat_params(model),
        _run_participants(session),
        session.context(request).aggregator,
        frozenset(request.forget),
        _Budget(float("inf")),
    )
    assert trained is not None  # an unbounded budget always trains
    return trained[0].to(torch.float32)
