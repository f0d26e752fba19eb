"""Recording policies (what the server keeps of each round), their registry, and the recorder.

The global model of every round (and the round's aggregate) is always kept: it is 1/C of a
round's uploads, every method and ``train --resume`` need it. Policies choose which *client
updates* are stored. Built in:

- ``all``: every accepted update (FedRecover, Cao et al. S&P'23 §4);
- ``every``: every update of rounds 1, 1+k, 1+2k, ... (FedEraser's Δt, Liu et al. IWQoS'21 §3);
- ``none``: no client updates (enough for Retrain and the no-unlearning control).

A plugin adds its own (Crab's window selection, FedADP's dual-layer selection) by declaring a
``PolicySpec`` in its ``fedunlearn.plugins.Plugin`` (``policies``): its name (the YAML
``history.policy``), the pydantic model of its options (the YAML section ``history.<name>``) and
a builder that gets the run's ``HistoryConfig`` and a ``PolicyEnv`` (the model, a reference-set
provider, the last round). ``POLICIES`` resolves a declared name on first lookup, importing only
that plugin's module. ``resolve_history`` validates the sections by the options models where a
run is assembled (``fedunlearn.runs``; ``fedunlearn.config`` stores them raw);
``fedunlearn.runs`` builds every policy through this registry and knows none by name.

A per-round policy (``RecordingPolicy``) decides when the round ends. A deferred policy
(``DeferredPolicy``) buffers rounds and decides later: ``select`` returns, for each finished
round, the updates of any buffered rounds to commit with it; the recorder writes them in the same
transaction as the round (``write_round(..., attach=...)``), so a selection is stored whole or
not at all. ``resume_round`` tells ``train --resume`` where its in-memory state can be rebuilt
from (rounds after it are dropped and re-run, bit-identically); ``train --continue`` opens the
first window of its new rounds at its start round (``PolicyEnv.first_round``).

Whatever the policy, ``HistoryRecorder`` writes one ``ClientRecord`` per sampled client and round:
status, n_c, the norm of the client's delta ||Δ_c|| and, in its scalars, ``<Δ_c, G_t>`` with the
round's aggregate G_t (``DOT_AGGREGATE_KEY``, float64), and ||Δ_c||_inf (``MAX_ABS_KEY``).
These cost three reductions per client; the first two let a method bound a client's influence
on rounds whose updates were not kept (Crab's ``rollback: bounded``, docs/methods/crab.md), the
last lets FedRecover find its threshold tau without reading every stored update. The client's
training loss is kept when the client reported one (DP clients do not: ``reported_loss``);
``client_values=False`` (a DP store whose uploads were clean, ``dp_scope: store_only``) keeps
none of the three. With ``history.encoding: float16`` the three values are those of the update
as the store holds it (its float16 copy, upcast to float32 as ``read_update`` reads it back;
an update kept in float32, itself), stored or not, so a record describes what a reader reads;
the store's metadata says so (``records_of_stored_copy``, ``encoding_meta``). Training
aggregates the float32 deltas either way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch
from pydantic import BaseModel, ValidationError
from torch import nn

from fedunlearn.errors import ConfigError, UnknownPolicyError
from fedunlearn.fl.records import ClientData, ClientUpdate, RoundRecord, UpdateStatus
from fedunlearn.history.store import ClientRecord, HistoryStore, RoundEntry, as_read
from fedunlearn.registry import Registry

DOT_AGGREGATE_KEY = "dot_aggregate"
# a client record's largest |coordinate| of its delta, ||Δ_c||_inf (FedRecover's threshold tau)
MAX_ABS_KEY = "max_abs"
# a client record's draws in its round under TV-stable sampling (absent: one draw)
MULTIPLICITY_KEY = "multiplicity"


class RecordingPolicy(Protocol):
    """Decides which client updates of a finished round are written to the store."""

    @property
    def name(self) -> str:
        """The policy's name (``history.policy``)."""
        ...

    def updates_to_store(self, record: RoundRecord) -> frozenset[int]:
        """Return the ids of the accepted clients whose update is stored."""
        ...


@runtime_checkable
class DeferredPolicy(Protocol):
    """Decides which updates to keep only after later rounds (e.g. when a window closes)."""

    name: str

    def resume_round(self, store: HistoryStore) -> int:
        """Set the policy's state from the store; return the round training continues after.

        Called before the first round of every training session (a new run, ``--resume``,
        ``--continue``); the state covers the rounds after ``PolicyEnv.first_round``.
        """
        ...

    def select(self, record: RoundRecord) -> dict[int, dict[int, torch.Tensor]]:
        """Buffer a finished round; return ``{round: {client_id: delta}}`` to commit with it."""
        ...


@dataclass(frozen=True)
class RecordAll:
    """Keep every accepted client update of every round."""

    name: str = "all"

    def updates_to_store(self, record: RoundRecord) -> frozenset[int]:
        """Keep all participants."""
        return frozenset(record.participants)


@dataclass(frozen=True)
class RecordEvery:
    """Keep every accepted client update of rounds 1, 1 + k, 1 + 2k, ..."""

    every: int = 5
    name: str = "every"

    def stores_round(self, round_: int) -> bool:
        """Return whether updates of ``round_`` are kept."""
        return (round_ - 1) % self.every == 0

    def updates_to_store(self, record: RoundRecord) -> frozenset[int]:
        """Keep all participants of every k-th round."""
        return frozenset(record.participants) if self.stores_round(record.round) else frozenset()


@dataclass(frozen=True)
class RecordNone:
    """Keep no client update (global models only)."""

    name: str = "none"

    def updates_to_store(self, record: RoundRecord) -> frozenset[int]:
        """Keep nobody."""
        return frozenset()


if TYPE_CHECKING:
    from fedunlearn.config import HistoryConfig


@dataclass(frozen=True)
class PolicyEnv:
    """What a recording policy may ask of the run it records (built by ``fedunlearn.runs``).

    Attributes:
        model: The run's architecture (evaluate flat parameter vectors with it; do not train it).
        final_round: T, the run's last round (a deferred policy flushes there).
        seed: The run's seed.
        reference_set: ``size -> ClientData``: a seeded clean subsample of the clients' training
            data (their data before any poisoning), the same for the same size and seed.
        store_transform: ``(round, client_id, delta) -> delta`` applied to the copies a policy
            stores, or None (FedADP's ``dp_scope: store_only`` stores noised copies).
        first_round: The round whose global model the policy's first window opens after: 0
            when training starts from M_0, the continuation's start round for ``train
            --continue`` (its windows cover the new rounds only; the rounds before it were
            selected, or applied, already).
        first_scalars: The metrics of M_{first_round} as the continuation measures them
            (``clients_loss`` over the clients never forgotten); a policy reads them instead of
            the stored round's, which may hold a forgotten client's data or nothing (a round
            an apply put in).
    """

    model: nn.Module
    final_round: int
    seed: int
    reference_set: Callable[[int], ClientData]
    store_transform: Callable[[int, int, torch.Tensor], torch.Tensor] | None = None
    first_round: int = 0
    first_scalars: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class PolicySpec:
    """A registered recording policy.

    Attributes:
        name: The YAML ``history.policy`` value.
        build: ``(history_config, env) -> policy``.
        options_type: Pydantic model of the YAML section ``history.<name>``, or None.
        clients_loss_samples: For a policy that reads the round metric ``clients_loss`` (the
            clients' mean loss on their own data), ``options -> samples per client``; else None.
        applies_store_transform: Whether the policy stores ``env.store_transform`` of each
            update it keeps (``privacy.dp_scope: store_only`` needs such a policy).
    """

    name: str
    build: Callable[[HistoryConfig, PolicyEnv], RecordingPolicy | DeferredPolicy]
    options_type: type[BaseModel] | None = None
    clients_loss_samples: Callable[[BaseModel], int] | None = None
    applies_store_transform: bool = False


POLICIES: Registry[PolicySpec] = Registry(
    "history policy", UnknownPolicyError, plugin_kind="policies"
)


def register_policy(spec: PolicySpec) -> PolicySpec:
    """Register a recording policy (a method package calls this on import)."""
    return POLICIES.add(spec.name, spec)


def _section_errors(err: ValidationError, name: str) -> str:
    parts = []
    for e in err.errors():
        where = ".".join(["history", name, *(str(p) for p in e["loc"])])
        got = e.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r})"
        parts.append(f"{where}: {e['msg'].removeprefix('Value error, ')}{shown}")
    return "; ".join(parts)


def resolve_history(history: HistoryConfig) -> HistoryConfig:
    """Validate the policy and its sections; return the config with every option in use.

    ``fedunlearn.config`` keeps ``history.<policy>`` sections as given; this validates each by its
    policy's options model (where a run is assembled: ``fedunlearn.runs``) and adds the active
    policy's defaults when its section is absent, so the stored config names every option.
    A resolved config resolves to itself.

    Raises:
        UnknownPolicyError: ``history.policy`` names no installed policy (lists them).
        ConfigError: A section names no policy with options, or an option is invalid (one
            line naming ``history.<policy>.<field>``, the value and what is allowed).
    """
    try:
        active = POLICIES.get(history.policy)
    except UnknownPolicyError as err:
        raise UnknownPolicyError(f"history.policy: {err}") from None
    sections: dict[str, BaseModel] = {}
    for name, value in history.sections.items():
        spec = POLICIES.get(name) if name in POLICIES else None
        if spec is None or spec.options_type is None:
            with_options = [n for n in POLICIES.names() if POLICIES.get(n).options_type]
            raise ConfigError(
                f"invalid configuration: history: unknown history section '{name}'; sections "
                f"are the options of a policy: {', '.join(with_options)}"
            )
        if isinstance(value, spec.options_type):
            sections[name] = value
            continue
        if value is not None and not isinstance(value, dict):
            raise ConfigError(
                f"invalid configuration: history.{name}: must be a mapping of the policy's "
                f"options (got {value!r})"
            )
        try:
            sections[name] = spec.options_type.model_validate(value or {})
        except ValidationError as err:
            raise ConfigError(f"invalid configuration: {_section_errors(err, name)}") from None
    if active.options_type is not None and history.policy not in sections:
        sections[history.policy] = active.options_type()
    return history.model_copy(update={"sections": sections})


def build_policy(history: HistoryConfig, env: PolicyEnv) -> RecordingPolicy | DeferredPolicy:
    """Return the recording policy ``history.policy`` configured for one run."""
    history = resolve_history(history)
    return POLICIES.get(history.policy).build(history, env)


register_policy(PolicySpec("all", lambda history, env: RecordAll()))
register_policy(PolicySpec("every", lambda history, env: RecordEvery(history.every)))
register_policy(PolicySpec("none", lambda history, env: RecordNone()))


def update_scalars(delta: torch.Tensor, aggregate64: torch.Tensor) -> dict[str, float]:
    """Return a client record's values of its delta: ``<Δ_c, G_t>`` and ``||Δ_c||_inf``."""
    return {
        DOT_AGGREGATE_KEY: float(delta.to(torch.float64) @ aggregate64),
        MAX_ABS_KEY: float(delta.abs().max()) if delta.numel() else 0.0,
    }


def multiplicity_scalar(record: RoundRecord, client_id: int) -> dict[str, int]:
    """Return ``{MULTIPLICITY_KEY: m}`` for a client of a TV-stable round, else ``{}``."""
    if not record.multiplicity:
        return {}
    return {MULTIPLICITY_KEY: int(record.multiplicity.get(client_id, 1))}


def record_multiplicity(record: ClientRecord) -> int:
    """Return how many of its round's draws a stored client record won (1 when unrecorded)."""
    return int(record.scalars.get(MULTIPLICITY_KEY, 1) or 1)


def reported_loss(value: float) -> float | None:
    """A client's training loss as a record keeps it: None when it reported none (NaN)."""
    return float(value) if math.isfinite(value) else None


def update_dtype_of(encoding: str) -> torch.dtype | None:
    """The dtype ``history.encoding`` stores client updates in (None: their own, float32)."""
    return torch.float16 if encoding == "float16" else None


def encoding_meta(encoding: str) -> dict[str, str | bool]:
    """The store metadata of ``history.encoding`` that ``HistoryRecorder`` records under.

    ``update_encoding``, and for an encoding that rounds the updates, ``records_of_stored_copy``:
    the records describe the stored copies (``RunMeta.records_describe_stored_updates``; a
    float16 run recorded before this marker existed has records of the float32 deltas).
    """
    meta: dict[str, str | bool] = {"update_encoding": encoding}
    if update_dtype_of(encoding) is not None:
        meta["records_of_stored_copy"] = True
    return meta


class HistoryRecorder:
    """Round observer that commits each finished round to a ``HistoryStore`` atomically.

    Args:
        store: The run's store.
        policy: The recording policy.
        client_values: Record each accepted client's ||Δ_c|| and ``<Δ_c, G_t>`` (default).
            False (``privacy.dp_scope: store_only``, where the uploads are clean and only the
            stored copies are noised) records neither: they would be noise-free values about
            each client in a store whose content is stated DP.
        update_dtype: The dtype stored updates are encoded in (``history.encoding``); None
            keeps the delta's own (float32). The norms and dot products are those of the
            encoded copy as read back (``as_read``).
    """

    def __init__(
        self,
        store: HistoryStore,
        policy: RecordingPolicy | DeferredPolicy,
        *,
        client_values: bool = True,
        update_dtype: torch.dtype | None = None,
    ) -> None:
        self.store = store
        self.policy = policy
        self.client_values = client_values
        self.update_dtype = update_dtype

    def on_round_end(self, record: RoundRecord) -> None:
        """Write the round: global model, aggregate, chosen updates, every client's outcome.

        Every accepted client's record carries ||Δ_c||, ``<Δ_c, G_t>`` (float64) and
        ||Δ_c||_inf. With a deferred policy, the updates it selects of earlier rounds are attached
        to this round's transaction.
        """
        attach: dict[int, dict[int, torch.Tensor]] = {}
        keep: frozenset[int] = frozenset()
        if isinstance(self.policy, DeferredPolicy):
            selected = self.policy.select(record).items()
            attach = {r: {c: self._encode(d) for c, d in ups.items()} for r, ups in selected}
        else:
            keep = self.policy.updates_to_store(record)
        current = attach.pop(record.round, {})
        aggregate = record.aggregate.to(torch.float64)
        clients = []
        for u in record.updates:
            # the update as the store holds it (``history.encoding``): its record describes that
            # copy as ``read_update`` reads it back (training aggregated the delta itself)
            copy = self._encode(u.delta)
            if u.client_id in keep:
                current[u.client_id] = copy
            clients.append(self._accepted_record(record, u, copy, aggregate))
        clients += [
            ClientRecord(
                client_id=r.client_id,
                status=UpdateStatus.REJECTED.value,
                num_samples=r.num_samples,
                norm=None,
                loss=None,
                reason=r.reason,
                scalars=multiplicity_scalar(record, r.client_id),
            )
            for r in record.rejected
        ]
        self.store.write_round(
            RoundEntry(
                round=record.round,
                global_model=record.global_after,
                aggregate=record.aggregate,
                updates=current,
                clients=clients,
                scalars=dict(record.metrics),
                shard_models=dict(record.shard_models),
            ),
            attach=attach,
        )

    def _accepted_record(
        self,
        record: RoundRecord,
        update: ClientUpdate,
        copy: torch.Tensor,
        aggregate64: torch.Tensor,
    ) -> ClientRecord:
        """An accepted client's record; its values are those of ``copy``, upcast as read back."""
        values: dict[str, float] = {}
        norm = None
        if self.client_values:
            read = as_read(copy)
            norm, values = float(read.norm()), update_scalars(read, aggregate64)
        return ClientRecord(
            client_id=update.client_id,
            status=UpdateStatus.ACCEPTED.value,
            num_samples=update.num_samples,
            norm=norm,
            loss=reported_loss(update.train_loss),
            reason=None,
            scalars={**values, **multiplicity_scalar(record, update.client_id)},
        )

    def _encode(self, delta: torch.Tensor) -> torch.Tensor:
        """The delta in ``update_dtype``; kept as it is where the cast would overflow to inf.

        Without ``update_dtype`` (float32 storage), the delta itself. A value beyond float16's
        range (65,504; e.g. a scaled attacker's update) would be stored as inf and poison every
        estimate that reads it, so that update keeps its own dtype (the store records each
        payload's dtype).
        """
        if self.update_dtype is None:
            return delta
        encoded = delta.to(self.update_dtype)
        if bool(torch.isfinite(encoded).all()) or not bool(torch.isfinite(delta).all()):
            return encoded
        return delta
