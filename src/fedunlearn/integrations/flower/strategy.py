"""A Flower ``Strategy`` that trains like fedunlearn's engine and records the same history.

Paper: none; the server side of ``fedunlearn.fl.engine.run_round`` split into Flower's hooks.

``HistoryStrategy.start(grid, initial_arrays, num_rounds)`` (Flower's loop) calls, per round:

1. ``configure_train``: draw the participants with the run's sampler exactly as ``run_rounds``
   does (``runs.setup.sampler_of``: a seeded fraction, or TV-stable sampling's multiset of K
   draws with replacement among the clients) and build one ``train`` message per distinct
   participant for the node hosting it (``FlowerClients.messages``);
2. ``aggregate_train``: decode the replies (every client's upload is visible here), record
   non-repliers as missing, apply the update mods, then hand the uploads to the engine's own
   ``run_round`` (screening, the run's aggregator, ``M_{t+1} = M_t + aggregate``, evaluation),
   (weights: n_c, or a TV-stable draw's multiplicities), and give the ``RoundRecord`` to the
   observers: ``MissingAwareRecorder`` (the recording
   policy, into the history store), the metrics writer, anything else;
3. ``configure_evaluate`` / ``aggregate_evaluate``: nothing (evaluation is on the server, in
   step 2, as in-process).

The arrays Flower carries between rounds are the flat global model (one float32 array).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedunlearn.fl.aggregators import Aggregator
from fedunlearn.fl.clients import ClientsWrapper, TrainTask
from fedunlearn.fl.engine import Evaluator, RoundObserver, run_round
from fedunlearn.fl.records import ClientUpdate, RoundRecord, UpdateStatus
from fedunlearn.fl.sampling import ClientDraw, ClientSampler, FractionSampler
from fedunlearn.history.policy import DeferredPolicy, HistoryRecorder, RecordingPolicy
from fedunlearn.history.store import ClientRecord, HistoryStore, RoundEntry
from fedunlearn.integrations.flower.driver import FlowerClients


def to_arrays(params: torch.Tensor) -> ArrayRecord:
    """Return a flat model as Flower arrays (one float32 array)."""
    return ArrayRecord([params.detach().to(torch.float32).contiguous().numpy()])


def from_arrays(arrays: ArrayRecord) -> torch.Tensor:
    """Return the flat model held by ``to_arrays``'s record."""
    (array,) = arrays.to_numpy_ndarrays()
    return torch.from_numpy(np.array(array, dtype=np.float32, copy=True))


class _MissingStore:
    """A ``HistoryStore`` stand-in adding ``missing`` client records to each round written."""

    def __init__(self, store: HistoryStore, missing: Mapping[int, Mapping[int, str]]) -> None:
        self._store = store
        self._missing = missing

    def write_round(self, entry: RoundEntry, attach: Mapping | None = None) -> None:
        present = {c.client_id for c in entry.clients}
        extra = [
            ClientRecord(client_id=cid, status=UpdateStatus.MISSING.value, reason=reason)
            for cid, reason in sorted(self._missing.get(entry.round, {}).items())
            if cid not in present
        ]
        if extra:
            entry = dataclasses.replace(entry, clients=[*entry.clients, *extra])
        self._store.write_round(entry, attach=attach or {})

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)


class MissingAwareRecorder(HistoryRecorder):
    """``HistoryRecorder`` that also records each round's missing clients (status ``missing``).

    Args:
        store: The run's history store.
        policy: The recording policy (per-round or deferred, e.g. Crab's).
        missing: ``{round: {client_id: reason}}``, filled by ``FlowerClients``.
        update_dtype: The dtype stored updates are encoded in (``history.encoding``).
    """

    def __init__(
        self,
        store: HistoryStore,
        policy: RecordingPolicy | DeferredPolicy,
        missing: Mapping[int, Mapping[int, str]],
        update_dtype: torch.dtype | None = None,
    ) -> None:
        missing_store = _MissingStore(store, missing)
        super().__init__(missing_store, policy, update_dtype=update_dtype)  # type: ignore[arg-type]


class _Uploads(ClientsWrapper):
    """The clients ``run_round`` asks (``fl.clients.Clients``): Flower's delivered uploads."""

    def __init__(self, clients: FlowerClients, uploads: list[ClientUpdate]) -> None:
        super().__init__(clients)
        self._uploads = uploads

    def train(self, task: TrainTask) -> list[ClientUpdate]:
        return self._uploads


class HistoryStrategy(Strategy):
    """fedunlearn's server round (sampling, aggregator, recording) as a Flower strategy.

    Args:
        clients: The federation over the Grid.
        aggregator: The run's aggregation rule (``make_aggregator``).
        participation: Fraction of clients sampled each round (without ``sampler``).
        sampler: The run's client sampler (``runs.setup.sampler_of``); default: a
            ``FractionSampler`` of ``participation`` with the clients' seed.
        evaluate: Server-side evaluation of each new global model (joins the round metrics).
        observers: Told about each finished round, in order (put the recorder first).
    """

    def __init__(
        self,
        clients: FlowerClients,
        aggregator: Aggregator,
        *,
        participation: float = 1.0,
        sampler: ClientSampler | None = None,
        evaluate: Evaluator | None = None,
        observers: Sequence[RoundObserver] = (),
    ) -> None:
        self.clients = clients
        self.aggregator = aggregator
        self.participation = participation
        self.sampler = sampler or FractionSampler(participation, clients.seed)
        self._draw: ClientDraw | None = None
        self.evaluate = evaluate
        self.observers = tuple(observers)
        self.records: list[RoundRecord] = []
        self._task: TrainTask | None = None
        self._sent_at = 0.0

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample the round's participants and build their ``train`` messages."""
        self._draw = self.sampler.draw(server_round, self.clients.client_ids)
        self._task = TrainTask(from_arrays(arrays), self._draw.ids, server_round)
        messages = self.clients.messages(self._task)
        self._sent_at = time.perf_counter()
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Screen and aggregate the uploads, record the round, return the new global model."""
        task = self._task
        if task is None or task.round != server_round:
            raise RuntimeError(f"aggregate_train({server_round}) before its configure_train")
        # Flower's send_and_receive ran in between: transport, client work, polling
        self.clients.stats.exchanges.append(time.perf_counter() - self._sent_at)
        self.clients.stats.exchange_seconds += self.clients.stats.exchanges[-1]
        uploads = self.clients.collect(list(replies), task)
        record = run_round(
            _Uploads(self.clients, uploads),
            self.aggregator,
            task.global_params,
            server_round,
            self._draw
            if self._draw is not None and not self._draw.size_weighted
            else task.client_ids,
            evaluate=self.evaluate,
        )
        for observer in self.observers:
            observer.on_round_end(record)
        self.records.append(record)
        metrics: dict[str, int | float | list[int] | list[float]] = {
            k: float(v) for k, v in record.metrics.items()
        }
        metrics["num-accepted"] = len(record.updates)
        metrics["num-missing"] = len(self.clients.missing.get(server_round, {}))
        return to_arrays(record.global_after), MetricRecord(metrics)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """No client-side evaluation: the server evaluates in ``aggregate_train``."""
        return []

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Nothing to aggregate."""
        return None

    def summary(self) -> None:
        """Log nothing beyond Flower's own start banner."""
