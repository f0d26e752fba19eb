"""The one interface every unlearning or recovery method implements, and what it returns.

A method (an ``Unlearner``) is built from validated hyperparameters, never data (scikit-learn
style). ``unlearn(request, context)`` takes a finished run, seen through an ``UnlearnContext``
(:mod:`fedunlearn.unlearn.context`), and returns an ``UnlearnResult``: the unlearned model, the
cost ledger (``Costs``, :mod:`fedunlearn.unlearn.costs`), the metrics of every unlearning round,
the method's ``Details`` (a frozen dataclass per method, ``to_dict()`` for JSON) and, once verified
(``fedunlearn.eval.Verifier``), its receipt (``verification``). Forgetting nobody returns the
run's final model unchanged, at zero cost. History a method needs but the run did not record raises
``UnsupportedHistoryError`` before any work. Every result carries its ``lineage``
(:mod:`fedunlearn.unlearn.lineage`): what the model was computed from, traced from the context's
log of the stored payloads the method read and the start model it declared
(``context.start_from``), ``exact`` or ``approximate``.

Client seeds: fresh local training in unlearning round t uses the original run's seed for round t
(``salt=0``), so retraining without the forgotten clients follows the batch orders the remaining
clients would have used, and replays are comparable round for round.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any, ClassVar, Generic, TypeVar, cast

import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from fedunlearn.config import PrivacyConfig
from fedunlearn.errors import ConfigError, UnsupportedHistoryError
from fedunlearn.history.result_claims import CLAIM_FIELDS, ResultClaims
from fedunlearn.history.store import run_meta_of
from fedunlearn.history.trajectory import Trajectory
from fedunlearn.privacy.releases import DPRelease
from fedunlearn.unlearn.context import UnlearnContext
from fedunlearn.unlearn.costs import Costs
from fedunlearn.unlearn.lineage import Lineage, nothing_to_forget
from fedunlearn.unlearn.receipt import BoundReport, Verification

__all__ = [
    "Costs",
    "Details",
    "MethodParams",
    "NoDetails",
    "ParamsT",
    "RunOutput",
    "UnlearnRequest",
    "UnlearnResult",
    "Unlearner",
    "jsonable",
]


class MethodParams(BaseModel):
    """Base of every method's hyperparameters: frozen, unknown keys rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")


#: A method's own parameters type: ``class Mine(Unlearner[MyParams])`` types ``self.params``.
ParamsT = TypeVar("ParamsT", bound=MethodParams)


@dataclass(frozen=True)
class UnlearnRequest:
    """What to remove: whole clients, and/or some samples of clients (sample-level deletion).

    Attributes:
        forget: Clients removed entirely (a deletion request, or the detected malicious set).
        kind: ``forget`` (right to be forgotten) or ``recover`` (poisoning).
        samples: ``((client, (sample id, ...)), ...)``, sorted: samples a client asks to delete
            while it stays in the federation (ids index the client's local training set as the
            run built it, 0..n_c-1). Only methods with ``serves_samples`` serve them.
    """

    forget: frozenset[int]
    kind: str = "forget"  # "forget" (right to be forgotten) or "recover" (poisoning)
    samples: tuple[tuple[int, tuple[int, ...]], ...] = ()

    def __post_init__(self) -> None:
        merged: dict[int, set[int]] = {}
        for client, ids in self.samples:
            merged.setdefault(int(client), set()).update(int(i) for i in ids)
        object.__setattr__(
            self,
            "samples",
            tuple((c, tuple(sorted(ids))) for c, ids in sorted(merged.items()) if ids),
        )

    @classmethod
    def of(
        cls,
        client_ids: Sequence[int],
        kind: str = "forget",
        samples: Mapping[int, Iterable[int]] | None = None,
    ) -> UnlearnRequest:
        """Build a request from any sequence of client ids (and client -> sample ids)."""
        if kind not in ("forget", "recover"):
            raise ConfigError(f"request kind must be 'forget' or 'recover'; got {kind!r}")
        pairs = tuple((int(c), tuple(int(i) for i in ids)) for c, ids in (samples or {}).items())
        return cls(frozenset(int(c) for c in client_ids), kind, pairs)

    @property
    def sample_map(self) -> dict[int, frozenset[int]]:
        """Client -> the sample ids it asks to delete."""
        return {c: frozenset(ids) for c, ids in self.samples}

    @property
    def empty(self) -> bool:
        """Whether the request removes nothing (no client, no sample)."""
        return not self.forget and not self.samples

    def with_forget(self, forget: frozenset[int]) -> UnlearnRequest:
        """Return this request forgetting ``forget`` (its samples and kind kept)."""
        return UnlearnRequest(frozenset(forget), self.kind, self.samples)


@dataclass(frozen=True)
class Details:
    """Base of every method's details: a frozen dataclass whose fields the method documents.

    ``to_dict()`` returns JSON-ready values (tensors become lists, tuples and sets lists,
    nested ``Details`` dicts).

    Two hooks the receipt (``fedunlearn.eval.Verifier``, docs/verification.md) reads:

    - a field ``warnings: tuple[str, ...]``, if the method defines one: sentences about a
      result that may not be trusted (e.g. a rollback that kept the forgotten clients'
      rounds); each becomes a warning of the ``method_warnings`` check;
    - ``certified_bound()``: the method's certified bound on its distance to a retrained
      model, or None (the default) if it certifies nothing;
    - a field ``assumptions: tuple[str, ...]``, if the method defines one: what the result
      rests on and no check of the receipt can see (e.g. Starfish's threat model, "semi-honest
      servers: a server that alters its shares is not detected"); the receipt carries them
      as ``assumptions``, verbatim.
    """

    def to_dict(self) -> dict[str, Any]:
        """Return the details as a JSON-ready dict."""
        return {f.name: jsonable(getattr(self, f.name)) for f in fields(self)}

    def certified_bound(self) -> BoundReport | None:
        """Return the certified bound this result satisfies, or None (no certificate)."""
        return None

    def claim_fields(self) -> dict[str, Any]:
        """Return the fields a reader acts on (``ResultClaims``) that this method defines."""
        names = {f.name for f in fields(self)}
        return {name: jsonable(getattr(self, name)) for name in CLAIM_FIELDS if name in names}


@dataclass(frozen=True)
class NoDetails(Details):
    """A method with nothing to report beyond its model, costs and round metrics."""


def jsonable(value: Any) -> Any:
    """Return ``value`` with tensors, tuples, sets and dataclasses turned into JSON types."""
    if isinstance(value, Details):
        return value.to_dict()
    if is_dataclass(value) and not isinstance(value, type):
        to_dict = getattr(value, "to_dict", None)
        return jsonable(to_dict() if callable(to_dict) else asdict(value))
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(jsonable(v) for v in value)
    return value


@dataclass(frozen=True)
class RunOutput:
    """What a method's ``_run`` computes: the model, per-round metrics, details, trajectory."""

    params: torch.Tensor
    round_metrics: Sequence[dict[str, float]] = ()
    details: Details = field(default_factory=NoDetails)
    trajectory: Trajectory | None = None


@dataclass(frozen=True)
class UnlearnResult:
    """The unlearned model with what it cost and how it got there.

    ``verification`` is None until the result is verified (``fedunlearn.eval.Verifier``
    returns a copy carrying its receipt).
    """

    method: str
    params: torch.Tensor
    costs: Costs
    round_metrics: tuple[dict[str, float], ...] = ()
    details: Details = field(default_factory=NoDetails)
    verification: Verification | None = None
    lineage: Lineage | None = None
    # the unlearned history, for methods that compute one (fedunlearn.history.trajectory)
    trajectory: Trajectory | None = None

    def claims(self) -> ResultClaims:
        """What this result says about itself: what ``fedunlearn apply`` reads from its file."""
        return ResultClaims.from_doc(
            {
                "method": self.method,
                "details": self.details.claim_fields(),
                "lineage": None if self.lineage is None else self.lineage.to_dict(),
                "verification": None if self.verification is None else self.verification.to_dict(),
            }
        )


class Unlearner(ABC, Generic[ParamsT]):
    """Base class of every method: validated hyperparameters and the ``unlearn`` contract.

    Subclasses name their parameters type for the checker and at run time (``class
    Mine(Unlearner[MyParams])`` with ``params_type = MyParams``), set ``required_policies``
    (history policies that hold what they need; ``None`` = any), set ``reads_round_models``
    False if they read no global model or aggregate but M_0 and the last model, implement
    ``_run`` and are registered with ``@register("name")`` (which sets ``name``).
    """

    name: ClassVar[str]
    params_type: ClassVar[type[MethodParams]] = MethodParams
    params: ParamsT
    required_policies: ClassVar[frozenset[str] | None] = None
    # True: reads global models or aggregates of rounds 1..T-1, which forget() may drop
    reads_round_models: ClassVar[bool] = True
    # True: reads stored payloads of rounds 1..T besides M_0; after a model-only apply those
    # rounds carry earlier forgotten clients' influence, so such a method refuses
    # (docs/lifecycle.md); False for methods that read M_0 and client records only (Retrain)
    reads_stored_rounds: ClassVar[bool] = True
    # True: serves a request on a history an applied result's trajectory replaced (rounds
    # 1..L with estimated updates, L != the config's T; docs/lifecycle.md, "Methods on an
    # applied history"); False: needs the rounds the run recorded as it trained, and refuses
    serves_generations: ClassVar[bool] = False
    # True: serves sample-level requests (``UnlearnRequest.samples``) exactly; False: refuses
    # them before any work, naming the methods that can
    serves_samples: ClassVar[bool] = False
    # True: serves a sharded run (``training.shards`` > 1: S isolated sub-federations whose
    # combined model is the run's); False: refuses it (its rounds are not one federation's)
    serves_shards: ClassVar[bool] = False
    # True: built for deletion-ready training (``training.sampling: tv_stable`` or shards); on
    # any other run it is a full Retrain, so ``compare --methods all`` leaves it out there
    deletion_ready: ClassVar[bool] = False

    @classmethod
    def dp_release(cls, params: MethodParams, privacy: PrivacyConfig) -> DPRelease | None:
        """How this method with ``params`` releases a DP model on a run with ``privacy``.

        None (the default): its fresh training runs without the run's DP mechanism, so its
        model is not DP. ``fedunlearn apply`` asks this, never the result file's claim
        (``fedunlearn.privacy.releases``); a method that noises every fresh update under the
        run's mechanism returns its ``DPRelease``.
        """
        return None

    def __init__(self, params: ParamsT | dict[str, Any] | None = None) -> None:
        # params_type is the class's ParamsT at run time (a ClassVar cannot name a TypeVar)
        if isinstance(params, self.params_type):
            self.params = cast(ParamsT, params)
        else:
            try:
                self.params = cast(ParamsT, self.params_type.model_validate(params or {}))
            except ValidationError as err:
                problems = "; ".join(
                    f"{'.'.join(map(str, e['loc']))}: {e['msg']} (got {e.get('input')!r})"
                    for e in err.errors()
                )
                raise ConfigError(
                    f"invalid parameters for method '{self.name}': {problems}"
                ) from None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params!r})"

    def check_history(self, context: UnlearnContext) -> None:
        """Raise ``UnsupportedHistoryError`` unless the run recorded what this method needs."""
        meta = run_meta_of(context.history)
        clean_from = meta.clean_from_round or 0
        if clean_from and self.reads_stored_rounds:
            raise UnsupportedHistoryError(
                f"{self.name} reads the stored rounds 1..{clean_from - 1}, which carry the "
                "influence of clients forgotten earlier (a result applied without its "
                f"trajectory made round {clean_from} the run's model); use retrain (M_0 and the "
                "client records only), or apply results of methods that return a trajectory"
            )
        # an apply (the store's events) sets clean_from_round, with or without a trajectory
        if meta.clean_from_round is not None and not self.serves_generations:
            raise UnsupportedHistoryError(
                f"{self.name} needs the rounds the run recorded as it trained; an unlearning "
                "result was applied to this run since (its history is a method's computed "
                f"trajectory, or carries earlier forgotten clients). Use {_generation_servers()}."
            )
        dropped = meta.dropped_models
        if dropped and self.reads_round_models:
            rounds = sorted({r for r, _ in dropped})
            raise UnsupportedHistoryError(
                f"{self.name} reads the global models of the run's rounds; forget() dropped "
                f"{len(dropped)} models and aggregates (rounds {rounds[0]}..{rounds[-1]}) so that "
                "no deleted update can be rebuilt. Use retrain or federaser (M_0 and the "
                "remaining clients' updates only)."
            )
        if context.training.shards is not None and not self.serves_shards:
            raise UnsupportedHistoryError(
                f"{self.name} reads the rounds of one federation; this run trained "
                f"{context.training.shards.count} isolated shards, whose combined rounds are not "
                f"one federation's. Use {_servers('serves_shards')}."
            )
        if self.required_policies is None:
            return
        policy = context.history.policy
        if policy not in self.required_policies:
            wanted = " or ".join(sorted(self.required_policies))
            raise UnsupportedHistoryError(
                f"{self.name} needs history policy {wanted}; this run used '{policy}'. "
                f"Retrain with history.policy={sorted(self.required_policies)[0]}."
            )

    def history_bytes_needed(self, context: UnlearnContext) -> int:
        """Payload bytes of the history this method needs kept (default: all the run stored)."""
        return context.history.stored_bytes()

    def unlearn(self, request: UnlearnRequest, context: UnlearnContext) -> UnlearnResult:
        """Remove ``request.forget`` from the run and return the unlearned model and costs."""
        if request.samples and not self.serves_samples:
            raise ConfigError(
                f"{self.name} removes whole clients only; a sample-level request (samples of "
                f"client(s) {', '.join(str(c) for c, _ in request.samples)}) is served exactly by "
                f"{_sample_servers()}"
            )
        self.check_history(context)
        if request.empty:
            return UnlearnResult(
                self.name,
                context.final_params.clone(),
                Costs(),
                lineage=nothing_to_forget(context.num_rounds),
            )
        started = time.perf_counter()
        out = self._run(request, context)
        if not isinstance(out, RunOutput):
            raise TypeError(f"{type(self).__name__}._run must return a RunOutput")
        elapsed = time.perf_counter() - started
        return UnlearnResult(
            method=self.name,
            params=out.params,
            costs=context.meter.finish(elapsed),
            round_metrics=tuple(out.round_metrics),
            details=out.details,
            lineage=context.lineage(request.forget, out.params, samples=request.sample_map),
            trajectory=out.trajectory,
        )

    @abstractmethod
    def _run(self, request: UnlearnRequest, context: UnlearnContext) -> RunOutput:
        """Compute the unlearned model, its per-round metrics and details."""


def _servers(flag: str) -> str:
    """Return the registered methods whose class sets ``flag``, as ``a, b or c``."""
    from fedunlearn.unlearn.registry import METHODS  # the registry imports this module

    names = [n for n in METHODS.names() if n != "none" and getattr(METHODS.get(n), flag, False)]
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else "".join(names)


def _sample_servers() -> str:
    """Return the registered methods that serve sample-level requests, as ``a, b or c``."""
    return _servers("serves_samples")


def _generation_servers() -> str:
    """Return the registered methods that serve an applied history, as ``a, b or c``."""
    return _servers("serves_generations")
