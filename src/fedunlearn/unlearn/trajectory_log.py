"""Collect the rounds a method computes into a ``Trajectory`` (``fedunlearn.history.trajectory``).

Retrain, FedEraser, FedRecover and Crab each build a new history from M_0: a sequence of rounds,
each applying an aggregate of client updates to the previous model. ``TrajectoryLog`` records
those rounds as the method runs them, in the store's unit (``RoundEntry``), numbered 1..L in the
order they were applied, so that applying the result can make them the run's history
(docs/lifecycle.md, "Methods on an applied history"):

- ``add(params, aggregate, updates, ...)``: a round the method aggregated itself; ``params`` must
  be the model the method computed as previous model + ``aggregate`` (the log keeps the tensors
  it is given, it recomputes nothing), ``updates`` the ``(client_id, delta)`` pairs the aggregate
  was computed from, ``estimated`` the clients whose update the method estimated rather than had
  the client compute (marked ``scalars["estimated"] = True``);
- ``add_record(record)``: a round the FL engine ran (``fl.engine.run_round``);
- ``add_stored(round_, forget)``: a round of the run's own history that the new one keeps as it is
  (Crab's rounds before its rollback point);
- ``trajectory(forgotten)``: the ``Trajectory``.

Each client record carries the same numbers the training recorder writes (n_c, ||Δ_c||, and
``<Δ_c, G_t>`` in float64 under ``DOT_AGGREGATE_KEY``), so a later request can read the new
history as it reads a trained run's. Memory: the log writes each round's global model, aggregate
and updates, (2 + n_t) d float32 values per round (docs/lifecycle.md gives sizes), to a
temporary file as it receives them (``history.spool``) and keeps only the rounds' records in
memory; the ``Trajectory`` reads a round's tensors back when it is accessed
(docs/performance.md, "1,000 clients").
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

import torch

from fedunlearn.fl.records import RoundRecord, UpdateStatus
from fedunlearn.history.policy import DOT_AGGREGATE_KEY, multiplicity_scalar, reported_loss
from fedunlearn.history.spool import SpooledRound, SpooledRounds, TensorSpool
from fedunlearn.history.store import ClientRecord, Scalar
from fedunlearn.history.trajectory import ESTIMATED_KEY, Trajectory
from fedunlearn.unlearn.context import UnlearnContext

__all__ = ["TrajectoryLog"]


def _record(
    client_id: int,
    delta: torch.Tensor,
    num_samples: int,
    aggregate64: torch.Tensor,
    *,
    estimated: bool,
    loss: float | None = None,
    extra: Mapping[str, int] | None = None,
) -> ClientRecord:
    return ClientRecord(
        client_id=client_id,
        status=UpdateStatus.ACCEPTED.value,
        num_samples=num_samples,
        norm=float(delta.norm()),
        loss=loss,
        scalars={
            DOT_AGGREGATE_KEY: float(delta.to(torch.float64) @ aggregate64),
            ESTIMATED_KEY: estimated,
            **(extra or {}),
        },
    )


class TrajectoryLog:
    """The rounds of a method's new history, in the order it applied them (module docstring).

    Args:
        context: The method's context (client sizes n_c).
        keeps_updates: Round -> whether its updates go into the trajectory (the run's recording
            policy, so an applied history keeps what the run would have kept); None: all.
    """

    def __init__(
        self, context: UnlearnContext, keeps_updates: Callable[[int], bool] | None = None
    ) -> None:
        self._context = context
        self._spool: TensorSpool | None = None  # created with the first recorded round
        self._rounds: list[SpooledRound] = []
        self._kept = 0
        self._keeps_updates = keeps_updates

    @property
    def length(self) -> int:
        """Rounds recorded so far (kept and computed)."""
        return self._kept + len(self._rounds)

    def keep(self, rounds: int) -> None:
        """Keep the run's rounds ``1..rounds`` unchanged, by reference (nothing is read).

        For an exact replay: no forgotten client and no deleted sample touched those rounds,
        so the new history shares them with the run's (``Trajectory.kept``). Call it first.

        Raises:
            ValueError: rounds were recorded already.
        """
        if self._rounds or self._kept:
            raise ValueError("keep() comes before any recorded round")
        self._kept = int(rounds)

    def add(
        self,
        params: torch.Tensor,
        aggregate: torch.Tensor,
        updates: Sequence[tuple[int, torch.Tensor]],
        *,
        estimated: Collection[int] = (),
        rejected: Sequence[tuple[int, str]] = (),
        scalars: Mapping[str, float] | None = None,
    ) -> None:
        """Record a round the method aggregated: model after it, aggregate, the updates used.

        Args:
            params: The model after the round (previous model + ``aggregate``).
            aggregate: The aggregate applied.
            updates: ``(client_id, delta)`` pairs the aggregate was computed from.
            estimated: Clients whose delta the method estimated (not computed by the client).
            rejected: ``(client_id, reason)`` of uploads left out of the aggregate.
            scalars: The round's metrics.
        """
        sizes = self._context.clients.num_samples
        aggregate64 = aggregate.to(torch.float64)  # once a round, not once a client
        clients = [
            _record(cid, delta, sizes(cid), aggregate64, estimated=cid in estimated)
            for cid, delta in updates
        ]
        clients += [
            ClientRecord(cid, UpdateStatus.REJECTED.value, sizes(cid), reason=reason)
            for cid, reason in rejected
        ]
        self._append(params, aggregate, dict(updates), clients, scalars or {})

    def add_record(
        self,
        record: RoundRecord,
        *,
        estimated: bool = False,
        carried: Sequence[ClientRecord] = (),
        carried_updates: Mapping[int, torch.Tensor] | None = None,
    ) -> None:
        """Record a round the FL engine ran (its accepted updates and rejected uploads).

        ``carried``/``carried_updates``: the run's own records and stored updates of clients the
        round did not recompute (a sharded replay keeps the shards it does not retrain).
        """
        aggregate64 = record.aggregate.to(torch.float64)
        clients = [
            _record(
                u.client_id,
                u.delta,
                u.num_samples,
                aggregate64,
                estimated=estimated,
                loss=reported_loss(u.train_loss),
                extra=multiplicity_scalar(record, u.client_id),
            )
            for u in record.updates
        ]
        clients += [
            ClientRecord(
                r.client_id,
                UpdateStatus.REJECTED.value,
                r.num_samples,
                reason=r.reason,
                scalars=multiplicity_scalar(record, r.client_id),
            )
            for r in record.rejected
        ]
        clients += list(carried)
        updates = {u.client_id: u.delta for u in record.updates} | dict(carried_updates or {})
        self._append(
            record.global_after,
            record.aggregate,
            updates,
            clients,
            record.metrics,
            record.shard_models,
        )

    def add_stored(self, round_: int, forget: frozenset[int]) -> None:
        """Keep round ``round_`` of the run's history as it is (no client of ``forget`` in it).

        The round must not have aggregated a client of ``forget``; their rejected or missing
        records, which had no influence, are left out. Reads the round's global model,
        aggregate and stored updates through the context's metered history.

        Raises:
            ValueError: if a client of ``forget`` was aggregated in the round.
        """
        history = self._context.history
        records = history.client_records(round_)
        aggregated = sorted(
            r.client_id for r in records if r.client_id in forget and r.status == "accepted"
        )
        if aggregated:
            raise ValueError(
                f"round {round_} aggregated forgotten client(s) {aggregated}; it cannot be kept"
            )
        kept = [r for r in records if r.client_id not in forget]
        updates = {r.client_id: history.read_update(round_, r.client_id) for r in kept if r.stored}
        self._append(
            history.read_model(round_),
            history.read_model(round_, "aggregate"),
            updates,
            [
                ClientRecord(
                    r.client_id,
                    r.status,
                    r.num_samples,
                    r.norm,
                    r.loss,
                    r.reason,
                    {**r.scalars, ESTIMATED_KEY: bool(r.scalars.get(ESTIMATED_KEY, False))},
                )
                for r in kept
            ],
            history.round_scalars(round_),
        )

    def _append(
        self,
        params: torch.Tensor,
        aggregate: torch.Tensor,
        updates: Mapping[int, torch.Tensor],
        clients: Sequence[ClientRecord],
        scalars: Mapping[str, Scalar],
        shard_models: Mapping[int, torch.Tensor] | None = None,
    ) -> None:
        if self._keeps_updates is not None and not self._keeps_updates(self.length + 1):
            updates = {}
        if self._spool is None:
            self._spool = TensorSpool()
        put = self._spool.put
        self._rounds.append(
            SpooledRound(
                round=self.length + 1,
                global_model=put(params),
                aggregate=put(aggregate),
                updates={cid: put(delta) for cid, delta in updates.items()},
                clients=clients,
                scalars={k: v for k, v in scalars.items() if k != "round"},
                shard_models={s: put(model) for s, model in (shard_models or {}).items()},
            )
        )

    def trajectory(self, forgotten: frozenset[int]) -> Trajectory | None:
        """Return the recorded rounds as a ``Trajectory`` without ``forgotten`` (None if empty)."""
        if not self._rounds and not self._kept:
            return None
        if self._spool is None:
            return Trajectory((), forgotten, kept=self._kept)
        return Trajectory(SpooledRounds(self._spool, self._rounds), forgotten, kept=self._kept)
