"""The one interface every unlearning or recovery method implements, and its cost ledger.

A method (an ``Unlearner``) is built from validated hyperparameters, never data (scikit-learn
style). ``unlearn(request, context)`` takes a finished run, seen through an ``UnlearnContext``:

- ``context.history``: the run's history store, read-only, counting every payload byte read;
- ``context.clients``: the federation restricted to the *remaining* clients, counting every
  local training request (participations, local epochs, bytes sent and received); asking a
  forgotten client to train is an error;
- the run's aggregator, config, evaluation function and its initial and final models;
- ``context.reference``: the run's clean reference set R (Crab's F and KL scores).

It returns an ``UnlearnResult``: the unlearned model, the cost ledger (``Costs``), the metrics of
every unlearning round, and method-specific details. Forgetting nobody returns the run's final
model unchanged, at zero cost. History a method needs but the run did not record raises
``UnsupportedHistoryError`` before any work.

Client seeds: fresh local training in unlearning round t uses the original run's seed for round t
(``salt=0``), so retraining without the forgotten clients follows the batch orders the remaining
clients would have used, and replays are comparable round for round.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from fedunlearn.config import RunConfig
from fedunlearn.errors import ConfigError, FedUnlearnError, UnsupportedHistoryError
from fedunlearn.fl.aggregators import Aggregator
from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.federation import Federation
from fedunlearn.fl.records import ClientData, ClientUpdate
from fedunlearn.history.store import ClientRecord, HistoryStore

Evaluator = Callable[[torch.Tensor], dict[str, float]]


class MethodParams(BaseModel):
    """Base of every method's hyperparameters: frozen, unknown keys rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")


@dataclass(frozen=True)
class UnlearnRequest:
    """Which clients to remove: a deletion request, or the detected malicious set (recovery)."""

    forget: frozenset[int]
    kind: str = "forget"  # "forget" (right to be forgotten) or "recover" (poisoning)

    @classmethod
    def of(cls, client_ids: Sequence[int], kind: str = "forget") -> UnlearnRequest:
        """Build a request from any sequence of ids."""
        if kind not in ("forget", "recover"):
            raise ConfigError(f"request kind must be 'forget' or 'recover'; got {kind!r}")
        return cls(frozenset(int(c) for c in client_ids), kind)


@dataclass(frozen=True)
class Costs:
    """What an unlearning run cost.

    ``client_participations`` counts (client, round) local trainings, i.e. the exact-update
    requests; ``client_epochs`` the local epochs they ran (the papers' round saving follows from
    it against Retrain); ``estimated_updates`` the client updates the server estimated instead
    (FedRecover); ``history_bytes_read`` the payload bytes read from the store;
    ``bytes_communicated`` the model and update bytes sent to and received from clients.
    """

    wall_seconds: float = 0.0
    rounds: int = 0
    client_participations: int = 0
    client_epochs: int = 0
    estimated_updates: int = 0
    history_bytes_read: int = 0
    bytes_communicated: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Return the ledger as a JSON-ready dict."""
        return asdict(self)


@dataclass
class CostMeter:
    """Mutable counters behind ``Costs``; the context's wrappers feed it."""

    rounds: int = 0
    client_participations: int = 0
    client_epochs: int = 0
    estimated_updates: int = 0
    history_bytes_read: int = 0
    bytes_communicated: int = 0

    def freeze(self, wall_seconds: float) -> Costs:
        """Return the frozen ledger."""
        return Costs(wall_seconds=wall_seconds, **asdict(self))


@dataclass(frozen=True)
class UnlearnResult:
    """The unlearned model with what it cost and how it got there."""

    method: str
    params: torch.Tensor
    costs: Costs
    round_metrics: tuple[dict[str, float], ...] = ()
    details: dict[str, Any] = field(default_factory=dict)


class MeteredHistory:
    """Read-only view of a ``HistoryStore`` that counts the payload bytes read."""

    def __init__(self, store: HistoryStore, meter: CostMeter) -> None:
        self._store = store
        self._meter = meter

    @property
    def meta(self) -> dict[str, Any]:
        """The run's metadata (config, malicious ids, client sizes, policy)."""
        return self._store.meta

    @property
    def policy(self) -> str:
        """The recording policy the run used."""
        return str(self._store.meta.get("history_policy", "unknown"))

    def rounds(self) -> list[int]:
        """Committed rounds (0 = M_0)."""
        return self._store.rounds()

    def _count(self, tensor: torch.Tensor) -> torch.Tensor:
        self._meter.history_bytes_read += tensor.numel() * tensor.element_size()
        return tensor

    def read_model(self, round_: int, kind: str = "global") -> torch.Tensor:
        """Return the stored global model after ``round_`` (or the round's aggregate)."""
        return self._count(self._store.read_model(round_, kind))

    def read_update(self, round_: int, client_id: int) -> torch.Tensor:
        """Return a stored client delta."""
        return self._count(self._store.read_update(round_, client_id))

    def has_update(self, round_: int, client_id: int) -> bool:
        """Return whether a client's delta of ``round_`` is stored."""
        return self._store.has_update(round_, client_id)

    def iter_updates(self, round_: int) -> Iterator[tuple[int, torch.Tensor]]:
        """Stream the stored deltas of a round."""
        for cid, delta in self._store.iter_updates(round_):
            yield cid, self._count(delta)

    def client_records(self, round_: int) -> list[ClientRecord]:
        """Every client's outcome in ``round_`` (status, n_c, norm, loss)."""
        return self._store.client_records(round_)

    def round_scalars(self, round_: int) -> dict[str, Any]:
        """The metrics recorded for ``round_``."""
        return self._store.round_scalars(round_)

    def stored_bytes(self) -> int:
        """Payload bytes the run keeps."""
        return self._store.stored_bytes()


class RemainingClients:
    """The federation as an unlearning method may use it: remaining clients only, metered."""

    def __init__(self, federation: Federation, forget: frozenset[int], meter: CostMeter) -> None:
        self._federation = federation
        self.forget = forget
        self._meter = meter
        self.ids: tuple[int, ...] = tuple(c for c in federation.client_ids if c not in forget)
        self.seed = federation.seed
        self.malicious = federation.malicious - forget

    @property
    def client_ids(self) -> tuple[int, ...]:
        """The remaining clients (what the training loop may sample from)."""
        return self.ids

    @property
    def model(self) -> torch.nn.Module:
        """The run's architecture (to evaluate flat parameter vectors; do not train it)."""
        return self._federation.model

    @property
    def layer_sizes(self) -> tuple[int, ...]:
        """Number of scalars of each parameter tensor, in flat-vector order."""
        return tuple(p.numel() for p in self._federation.model.parameters())

    @property
    def spec(self) -> LocalTrainingSpec:
        """The run's local training hyperparameters."""
        return self._federation.spec

    @property
    def num_params(self) -> int:
        """Model size d."""
        return self._federation.num_params

    def num_samples(self, client_id: int) -> int:
        """n_c of a client (remaining or forgotten: the server knows every size)."""
        return self._federation.num_samples(client_id)

    def train(
        self,
        global_params: torch.Tensor,
        client_ids: Sequence[int],
        round_: int,
        *,
        spec: LocalTrainingSpec | None = None,
        salt: int = 0,
    ) -> list[ClientUpdate]:
        """Ask remaining clients for fresh local training from ``global_params``.

        Raises:
            FedUnlearnError: if a client being forgotten is asked.
        """
        asked = sorted(set(client_ids) & self.forget)
        if asked:
            raise FedUnlearnError(
                f"client(s) {asked} are being forgotten and cannot be asked to train"
            )
        if not client_ids:
            return []
        spec = spec or self.spec
        updates = self._federation.train(global_params, client_ids, round_, spec=spec, salt=salt)
        n = len(client_ids)
        self._meter.client_participations += n
        self._meter.client_epochs += n * spec.epochs
        self._meter.bytes_communicated += 2 * n * self.num_params * 4  # model down, delta up
        return updates


@dataclass
class UnlearnContext:
    """A finished run as an unlearning method sees it."""

    history: MeteredHistory
    clients: RemainingClients
    aggregator: Aggregator
    config: RunConfig
    num_rounds: int
    initial_params: torch.Tensor
    final_params: torch.Tensor
    evaluate: Evaluator | None
    meter: CostMeter
    reference: ClientData | None = None  # Crab's clean reference set R (runs.reference_set)

    def aggregate(self, updates: Sequence[tuple[int, torch.Tensor]]) -> torch.Tensor:
        """Aggregate ``(client_id, delta)`` pairs with the run's rule, weighted by n_c."""
        deltas = torch.stack([d.to(torch.float32) for _, d in updates])
        weights = torch.tensor([float(self.clients.num_samples(c)) for c, _ in updates])
        return self.aggregator(deltas, weights)


class Unlearner:
    """Base class of every method: validated hyperparameters and the ``unlearn`` contract.

    Subclasses set ``name``, ``params_type`` and ``required_policies`` (history policies that
    hold what they need; ``None`` = any) and implement ``_run``.
    """

    name: ClassVar[str]
    params_type: ClassVar[type[MethodParams]] = MethodParams
    required_policies: ClassVar[frozenset[str] | None] = None

    def __init__(self, params: MethodParams | dict[str, Any] | None = None) -> None:
        if isinstance(params, self.params_type):
            self.params = params
        else:
            try:
                self.params = self.params_type.model_validate(params or {})
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
        self.check_history(context)
        if not request.forget:
            return UnlearnResult(self.name, context.final_params.clone(), Costs())
        started = time.perf_counter()
        params, round_metrics, details = self._run(request, context)
        wall = time.perf_counter() - started
        return UnlearnResult(
            method=self.name,
            params=params,
            costs=context.meter.freeze(wall),
            round_metrics=tuple(round_metrics),
            details=details,
        )

    def _run(
        self, request: UnlearnRequest, context: UnlearnContext
    ) -> tuple[torch.Tensor, list[dict[str, float]], dict[str, Any]]:
        """Compute the unlearned model; return (params, per-round metrics, details)."""
        raise NotImplementedError
