"""A finished run as an unlearning method sees it: metered history, remaining clients, settings.

``UnlearnContext`` gives a method what it uses and nothing else:

- ``history``: a ``HistoryReader`` over the run's store, read-only, counting every payload byte
  read and logging every payload read (``MeteredHistory``: its ``log``, a
  ``fedunlearn.unlearn.lineage.ReadLog``); its metadata holds no attack ground truth;
- ``start_from(round)``: read the stored global model the method starts from and declare it
  (every method calls it once, where its algorithm starts); ``lineage(forget, params)`` turns
  the log into the result's ``Lineage`` (``Unlearner.unlearn`` calls it). ``initial_params``
  is for shapes and dtypes: a method reads its models through ``history`` or ``start_from``,
  so the log sees them; ``final_params`` (M_T) is logged as a read of the last global model;
- ``clients``: the run's clients (``fl.clients.RunClients``: ids, sizes, ``train(TrainTask)``,
  the run seed and the model template) restricted to the *remaining* ones
  (``RemainingClients``), counting every local training request (participations, local epochs,
  bytes sent and received); asking a forgotten client to train is an error;
- ``training``: the run's round count, participation rate and aggregation rule name, and
  ``aggregate`` to apply that rule;
- ``recording`` (the run's ``history`` section: policy and its options) and ``privacy`` (the
  run's DP settings), for methods whose algorithm depends on how the run was recorded;
- ``evaluate``: the evaluation hook (test accuracy, loss, backdoor ASR) or None;
- ``reference_set(size)``: a seeded clean subsample of the clients' data, for the methods that
  ask for one (Crab's R);
- ``end_round`` / ``record_round``: close one unlearning round: count it in the costs
  (``meter``) and return its metrics row. Methods never count by hand.

Which clients attacked is *not* in the context: a recovery request names them.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fedunlearn.config import HistoryConfig, PrivacyConfig
from fedunlearn.errors import FedUnlearnError, UnsupportedHistoryError
from fedunlearn.fl.aggregators import Aggregator
from fedunlearn.fl.clients import ClientsWrapper, RunClients, TrainTask
from fedunlearn.fl.records import ClientData, ClientUpdate, RoundRecord
from fedunlearn.fl.sampling import ClientDraw, ClientSampler
from fedunlearn.fl.shards import ShardPlan
from fedunlearn.history.store import ClientRecord, HistoryReader, Scalar, SizedUpdates
from fedunlearn.unlearn.costs import CostMeter
from fedunlearn.unlearn.derived_cache import DerivedCache
from fedunlearn.unlearn.lineage import (
    Lineage,
    Read,
    ReadLog,
    first_tainted_round,
    trace_lineage,
)

__all__ = [
    "CostMeter",
    "Evaluator",
    "MeteredHistory",
    "PrivateClients",
    "RemainingClients",
    "TrainingInfo",
    "UnlearnContext",
]

Evaluator = Callable[[torch.Tensor], dict[str, float]]
# metadata keys a method must not see: the attack's ground truth (and the config that holds it)
_HIDDEN_META = frozenset({"malicious", "config"})


RECORDS_CACHED = 4096  # rounds of client records a MeteredHistory keeps (a few MB)


class MeteredHistory:
    """A ``HistoryReader`` over another reader that counts and logs the payloads read.

    Args:
        store: The reader to meter.
        meter: Where payload bytes are counted.
        log: Where reads are logged (default: a new ``ReadLog``); a view over another copy of
            the same history (a Starfish server's share store) may share its context's log.

    Attributes:
        log: Every distinct payload read (kind, round, client), for the result's lineage.
    """

    def __init__(self, store: HistoryReader, meter: CostMeter, log: ReadLog | None = None) -> None:
        self._store = store
        self._meter = meter
        self.log = ReadLog() if log is None else log
        self._records: dict[int, list[ClientRecord]] = {}
        # an update counts the bytes its payload takes as stored (a float16 payload, read as
        # float32, 2 a value), where the reader says them (the store does)
        self._sized = store if isinstance(store, SizedUpdates) else None

    @property
    def meta(self) -> dict[str, Any]:
        """The run's metadata (client sizes, policy, ...), without the attack's ground truth."""
        return {k: v for k, v in self._store.meta.items() if k not in _HIDDEN_META}

    @property
    def policy(self) -> str:
        """The recording policy the run used."""
        return self._store.policy

    def rounds(self) -> list[int]:
        """Committed rounds (0 = M_0)."""
        return self._store.rounds()

    def _count(self, tensor: torch.Tensor, size: int | None = None) -> torch.Tensor:
        """Count ``size`` bytes read (default: the tensor's own)."""
        self._meter.add(
            history_bytes_read=tensor.numel() * tensor.element_size() if size is None else size
        )
        return tensor

    def read_model(self, round: int, kind: str = "global") -> torch.Tensor:
        """Return the stored global model after ``round`` (or the round's aggregate)."""
        tensor = self._count(self._store.read_model(round, kind))
        self.log.record("aggregate" if kind == "aggregate" else "global", round)
        return tensor

    def read_update(self, round: int, client_id: int) -> torch.Tensor:
        """Return a stored client delta (counted at its payload's bytes as stored)."""
        if self._sized is None:
            tensor = self._count(self._store.read_update(round, client_id))
        else:
            tensor = self._count(*self._sized.read_sized_update(round, client_id))
        self.log.record("update", round, client_id)
        return tensor

    def read_shard_model(self, round: int, shard: int) -> torch.Tensor:
        """Return a shard's stored model after ``round`` (a sharded run)."""
        tensor = self._count(self._store.read_shard_model(round, shard))
        self.log.record("global" if round == 0 else "shard", round, shard if round else None)
        return tensor

    def has_update(self, round: int, client_id: int) -> bool:
        """Return whether a client's delta of ``round`` is stored."""
        return self._store.has_update(round, client_id)

    def iter_updates(self, round: int) -> Iterator[tuple[int, torch.Tensor]]:
        """Stream the stored deltas of a round."""
        sized: Iterator[tuple[int, torch.Tensor, int | None]]
        if self._sized is None:
            sized = ((cid, d, None) for cid, d in self._store.iter_updates(round))
        else:
            sized = self._sized.iter_sized_updates(round)
        for cid, delta, size in sized:
            self.log.record("update", round, cid)
            yield cid, self._count(delta, size)

    def client_records(self, round: int) -> list[ClientRecord]:
        """Every client's outcome in ``round`` (status, n_c, norm, loss).

        Kept per round for the context's life (at most ``RECORDS_CACHED`` rounds): a replay asks
        for a round's records three or four times (selection, calibration, lineage, its log),
        and each read parses and validates every record again (0.7 ms for ten clients, 0.5 s
        of a Crab request at 1,000 clients). The store cannot change under a method: the
        session refuses a result read across another process's commit (``check_unchanged``).
        """
        cached = self._records.get(round)
        if cached is None:
            cached = self._store.client_records(round)
            if len(self._records) >= RECORDS_CACHED:
                del self._records[next(iter(self._records))]  # the oldest round asked for
            self._records[round] = cached
        return list(cached)

    def round_scalars(self, round: int) -> dict[str, Scalar]:
        """The metrics recorded for ``round``."""
        return self._store.round_scalars(round)

    def stored_bytes(self) -> int:
        """Payload bytes the run keeps."""
        return self._store.stored_bytes()


class RemainingClients(ClientsWrapper):
    """A run's clients as an unlearning method may use them: remaining clients only, metered.

    Satisfies ``fl.clients.RunClients`` over any ``RunClients`` (the in-process federation, the
    session's fresh-training wrapper of it, Flower's clients); the server knows every client's
    size (``num_samples``), remaining or forgotten.
    """

    def __init__(self, federation: RunClients, forget: frozenset[int], meter: CostMeter) -> None:
        super().__init__(federation)
        self.forget = forget
        self._meter = meter
        self._remaining = tuple(c for c in federation.client_ids if c not in forget)

    @property
    def client_ids(self) -> tuple[int, ...]:
        """The remaining clients (what the training loop may sample from)."""
        return self._remaining

    def train(self, task: TrainTask) -> list[ClientUpdate]:
        """Ask remaining clients for fresh local training (``fl.clients.Clients.train``).

        Raises:
            FedUnlearnError: if a client being forgotten is asked.
        """
        asked = sorted(set(task.client_ids) & self.forget)
        if asked:
            raise FedUnlearnError(
                f"client(s) {asked} are being forgotten and cannot be asked to train"
            )
        if not task.client_ids:
            return []
        spec = task.local_spec(self.spec)
        with self._meter.timed("client_train_seconds"):
            updates = self._wrapped.train(dataclasses.replace(task, spec=spec))
        n = len(task.client_ids)
        self._meter.add(
            client_participations=n,
            client_epochs=n * spec.epochs,
            bytes_communicated=2 * n * self.num_params * 4,  # model down, delta up
        )
        return updates


@dataclass(frozen=True)
class TrainingInfo:
    """The run's training settings a method may need besides local training (``clients.spec``).

    Attributes:
        participation: Share of clients sampled per round.
        aggregator: Name of the run's aggregation rule (``context.aggregate`` applies it).
        sampler: The run's client sampler when it re-draws on the remaining clients
            (TV-stable sampling: ``UnlearnContext.draw``); None: the original run's
            participants are kept (minus the forgotten).
        shards: A sharded run's assignment (``fl.shards.ShardPlan``), else None.
        shard_samplers: Shard -> its sampler, when the shards re-draw (TV-stable sampling).
    """

    participation: float = 1.0
    aggregator: str = "fedavg"
    sampler: ClientSampler | None = None
    shards: ShardPlan | None = None
    shard_samplers: Mapping[int, ClientSampler] = field(default_factory=dict)

    @property
    def deletion_ready(self) -> bool:
        """Whether the run was trained with TV-stable (deletion-consistent) sampling."""
        return self.sampler is not None or bool(self.shard_samplers)


@dataclass(frozen=True)
class PrivateClients:
    """The remaining clients training under the run's DP mechanism at a stated budget.

    Built by ``UnlearnContext.private_clients`` for a method that releases a DP model (FedADP's
    ``unlearn_dp``); metered like ``clients``.

    Attributes:
        clients: The remaining clients, training with the mechanism.
        stats: Round -> the mechanism's ledger row of each round they trained (RoundDPSGD or
            RoundNoise of ``fedunlearn.privacy``).
        close: Stops what the mechanism started; call it when done.
    """

    clients: RunClients
    stats: Callable[[], Mapping[int, Any]]
    close: Callable[[], None]


@dataclass
class UnlearnContext:
    """A finished run as an unlearning method sees it (see the module docstring)."""

    history: HistoryReader
    clients: RunClients  # RemainingClients; a Starfish server's PublicClients in a deployment
    aggregator: Aggregator
    num_rounds: int
    initial_params: torch.Tensor
    final_model: torch.Tensor  # M_T unlogged: shapes, dtypes, digests (``final_params`` logs)
    meter: CostMeter
    evaluate: Evaluator | None = None
    training: TrainingInfo = field(default_factory=TrainingInfo)
    recording: HistoryConfig = field(default_factory=HistoryConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    fingerprint: str = ""  # identifies the run (cache keys); empty: do not cache
    reference_provider: Callable[[int], ClientData] | None = None
    # (epsilon_of, noise_salt=0) -> the remaining clients under the run's DP mechanism (None:
    # no DP training); epsilon_of None: the run's stored ε_t (ε_max where none is stored); a
    # DP release passes its own noise_salt (``release_noise_salt``)
    private_clients: Callable[..., PrivateClients] | None = None
    # () -> the clip norm of a DP release for this request: the configured one, or 'auto'
    # recomputed over the remaining clients (``UnlearnSession.release_clip_norm``); None: the
    # context cannot compute it (no data here)
    release_clip_norm: Callable[[], float | None] | None = None
    # (client, sample ids) -> the first round whose local training used one of them (the
    # client's own answer: it regenerates its mini-batches), None if none did
    first_sample_use: Callable[[int, frozenset[int]], int | None] | None = None
    # what a method derives from the run alone, kept for the next request (None: not kept)
    derived_cache: DerivedCache | None = None

    def release_noise_salt(self, method: str, forget: frozenset[int]) -> int:
        """Return the noise salt of a DP release: its own noise, never a round's earlier one.

        A DP release that re-runs rounds of the run (DP Retrain) must not draw the noise those
        rounds' uploads drew: with the same noise and other data the difference of the two
        releases cancels it. The salt derives from the method, the forget set and the model
        the run is at (one per generation), so two requests never share it, and the same
        request computed twice gives the same (identical) release.
        """
        digest = hashlib.sha256(
            f"{method}|{sorted(forget)}|".encode()
            + self.final_model.detach().to(torch.float32).cpu().numpy().tobytes()
        ).digest()
        return int.from_bytes(digest[:7], "little") or 1

    @property
    def final_params(self) -> torch.Tensor:
        """M_T, the run's last global model; using it is a read of that model (lineage).

        A result computed from M_T (even 0.999 M_T + 0.001 M_0) carries the forgotten
        clients' influence, so asking for it is logged like ``history.read_model``: a method
        that needs only its shape or dtype reads ``initial_params``.
        """
        log = getattr(self.history, "log", None)
        if log is not None:
            log.record("global", self.num_rounds)
        return self.final_model

    @property
    def has_reference_set(self) -> bool:
        """Whether ``reference_set`` can be asked for."""
        return self.reference_provider is not None

    def reference_set(self, size: int) -> ClientData:
        """Return a seeded clean subsample of the clients' data of ``size`` samples.

        Raises:
            UnsupportedHistoryError: if this context was built without the run's data.
        """
        if self.reference_provider is None:
            raise UnsupportedHistoryError(
                "this method needs a reference set of the clients' data and this context has "
                "none; open the run with UnlearnSession."
            )
        return self.reference_provider(size)

    def original_participants(self, round_: int) -> list[int]:
        """Return the remaining clients the original run sampled in ``round_``, sorted.

        Every client the run asked to train counts, whether its upload was accepted or rejected:
        a retrained run asks the same clients (Retrain's participants, and the cost it is
        compared with).
        """
        remaining = set(self.clients.client_ids)
        return sorted(
            {r.client_id for r in self.history.client_records(round_) if r.client_id in remaining}
        )

    def draw(self, round_: int, shard: int | None = None) -> ClientDraw:
        """Return round ``round_``'s participants on the remaining clients (of ``shard``).

        A run trained with TV-stable sampling re-draws the round with its own sampler on the
        remaining clients (deletion-consistent: a slot a forgotten client had won moves to the
        remaining client of next-smallest key; every other slot is the original run's). Other
        runs keep the original run's participants of the round, minus the forgotten ones
        (``original_participants``), each weighted by n_c. ``shard``: a sharded run's shard
        (its members only, its own sampler).
        """
        shards = self.training.shards
        if shard is not None and shards is None:
            raise UnsupportedHistoryError(f"shard {shard} asked for on a run without shards")
        members = None if shard is None or shards is None else set(shards.members(shard))
        sampler = (
            self.training.sampler if shard is None else self.training.shard_samplers.get(shard)
        )
        if sampler is None:
            ids = self.original_participants(round_)
            if members is not None:
                ids = [c for c in ids if c in members]
            return ClientDraw(dict.fromkeys(ids, 1))
        present = self.clients.client_ids
        if members is not None:
            present = tuple(c for c in present if c in members)
        return sampler.draw(round_, present)

    def first_drawn_round(self, forget: frozenset[int]) -> int | None:
        """Return the first round whose client records hold a client of ``forget`` (any status)."""
        for t in range(1, self.num_rounds + 1):
            if any(r.client_id in forget for r in self.history.client_records(t)):
                return t
        return None

    def first_use(
        self, forget: frozenset[int], samples: Mapping[int, frozenset[int]]
    ) -> int | None:
        """Return the first round that drew a client of ``forget`` or used a listed sample.

        The point from which training on the reduced data can differ from the run's own rounds
        (docs/deletion_ready.md): before it, every draw and every mini-batch is the same.

        Raises:
            UnsupportedHistoryError: samples are listed and this context cannot ask the clients
                which rounds used them (``first_sample_use`` not given).
        """
        rounds = [] if not forget else [self.first_drawn_round(forget)]
        if samples and self.first_sample_use is None:
            raise UnsupportedHistoryError(
                "this context cannot ask the clients which rounds used the deleted samples; "
                "open the run with UnlearnSession"
            )
        for client, ids in samples.items():
            assert self.first_sample_use is not None
            rounds.append(self.first_sample_use(client, ids))
        found = [r for r in rounds if r is not None]
        return min(found) if found else None

    def start_from(self, round_: int) -> torch.Tensor:
        """Read the stored global model M_``round_`` and declare it the model the method starts at.

        The read goes through ``history`` (metered and logged like any other); the declaration
        is what the result's lineage names as its start (the first one counts).
        """
        params = self.history.read_model(round_)
        log = self.read_log
        if log is not None:
            log.declare_start(round_)
        return params

    @property
    def read_log(self) -> ReadLog | None:
        """The log of what the method read; None when ``history`` is not a ``MeteredHistory``."""
        return self.history.log if isinstance(self.history, MeteredHistory) else None

    def lineage(
        self,
        forget: frozenset[int],
        params: torch.Tensor,
        *,
        samples: Mapping[int, frozenset[int]] | None = None,
    ) -> Lineage | None:
        """Return what the result ``params`` was computed from (``fedunlearn.unlearn.lineage``).

        The first tainted round comes from the store's client records (accepted updates) and,
        for deleted samples, from the first round whose local training used one of them
        (``first_sample_use``). A result bitwise equal to ``final_params`` that never read M_T
        counts as a read of M_T (the context's copy returned as is). None when the history is
        not metered (nothing was logged).

        Args:
            forget: The clients being forgotten.
            params: The method's result.
            samples: Client -> sample ids being deleted (sample-level requests).
        """
        log = self.read_log
        if log is None:
            return None
        history = self.history
        accepted = [
            (t, [r.client_id for r in history.client_records(t) if r.status == "accepted"])
            for t in range(1, self.num_rounds + 1)
        ]
        first = _earliest(
            first_tainted_round(accepted, forget),
            self.first_use(frozenset(), samples) if samples else None,
        )
        shard_first: dict[int, int | None] | None = None
        shards = self.training.shards
        if shards is not None:
            shard_first = {}
            for s in shards.shards:
                members = set(shards.members(s))
                mine = {c: ids for c, ids in (samples or {}).items() if c in members}
                shard_first[s] = _earliest(
                    first_tainted_round(accepted, forget & members),
                    self.first_use(frozenset(), mine) if mine else None,
                )
        final = Read(self.num_rounds, "global")
        returned = (
            [final]
            if final not in log.reads
            and params.shape == self.final_model.shape
            and params.dtype == self.final_model.dtype
            and torch.equal(params.detach().cpu(), self.final_model.cpu())
            else []
        )
        return trace_lineage(
            log,
            forget,
            first,
            self.num_rounds,
            returned=returned,
            samples=samples or {},
            shard_first=shard_first,
            shard_of=None if shards is None else shards.shard_of,
        )

    def end_round(self, round_: int, params: torch.Tensor) -> dict[str, float]:
        """Close unlearning round ``round_`` at model ``params``: count it, return its row.

        Returns:
            ``{"round": round_}`` and, when the context evaluates, the metrics of ``params``.
        """
        self.meter.add(rounds=1)
        row: dict[str, float] = {"round": round_}
        if self.evaluate is not None:
            row.update(self.evaluate(params))
        return row

    def record_round(self, record: RoundRecord) -> dict[str, float]:
        """Close an unlearning round the training loop ran (``fl.engine``): count it; its row.

        Returns:
            ``{"round": record.round}`` and the round's own metrics (train loss, evaluation).
        """
        self.meter.add(rounds=1)
        return {"round": record.round, **record.metrics}

    def aggregate(self, updates: Sequence[tuple[int, torch.Tensor]]) -> torch.Tensor:
        """Aggregate ``(client_id, delta)`` pairs with the run's rule, weighted by n_c."""
        deltas = torch.stack([d.to(torch.float32) for _, d in updates])
        weights = torch.tensor([float(self.clients.num_samples(c)) for c, _ in updates])
        return self.aggregator(deltas, weights)


def _earliest(*rounds: int | None) -> int | None:
    """Return the smallest of the rounds given, None if all are None."""
    found = [r for r in rounds if r is not None]
    return min(found) if found else None
