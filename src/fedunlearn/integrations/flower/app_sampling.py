"""Deletion-ready sampling over a user's Flower app: FATS's rounds around any strategy.

With ``sampling = "tv_stable"`` (docs/deletion_ready.md), ``Recording`` decides who trains, not
the wrapped strategy (whose sampling would draw among Flower's node ids):

- each round draws P[r], K draws with replacement, with the run's ``TvStableSampler`` among the
  clients of the nodes connected *now* (``NodeMap.present``), K frozen at the start
  (``participation`` x the clients present then, the strategy's ``fraction_train``);
- a client drawn m times receives one train message carrying ``fedunlearn.multiplicity = m``,
  the run seed and round it derives its seed from, ``local-steps`` and ``batch-size`` (its
  ClientApp draws its mini-batches with ``app_protocol.local_batches``);
- the round's model is the engine's own (``fl.engine.run_round``: ``M_t = M_{t-1} +
  fedavg(Δ_c, weights m_c)``), the arithmetic an exact replay (``tv_exact``) repeats; the
  strategy aggregates the round's metrics only, each reply weighted by its multiplicity.

So the recorded run is the run ``fedunlearn train`` would record with ``training.sampling:
tv_stable`` on the same clients, and ``tv_exact`` over the app recomputes only from the first
round that drew a forgotten client.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from fedunlearn.errors import ConfigError
from fedunlearn.fl.aggregators import Aggregator
from fedunlearn.fl.clients import TrainTask
from fedunlearn.fl.engine import run_round
from fedunlearn.fl.records import ClientUpdate, RoundRecord
from fedunlearn.fl.sampling import ClientDraw, TvStableSampler, tv_clients_per_round
from fedunlearn.integrations.flower.app_nodes import NodeMap
from fedunlearn.integrations.flower.app_protocol import (
    CONFIG_CLIENT,
    CONFIG_MULTIPLICITY,
    CONFIG_ROUND,
    CONFIG_RUN_SEED,
    LOCAL_STEPS,
    Reply,
    reply_client,
)
from fedunlearn.integrations.flower.app_settings import TrainSettings


class _Uploads:
    """The clients ``run_round`` asks: the replies already received."""

    def __init__(self, updates: list[ClientUpdate], num_params: int) -> None:
        self._updates = updates
        self.num_params = num_params

    def train(self, task: TrainTask) -> list[ClientUpdate]:
        return self._updates


class TvRounds:
    """FATS's rounds over the app's nodes (module docstring).

    Args:
        nodes: The app's clients and their nodes.
        sampler: The run's sampler (K frozen).
        seed: The run seed (clients derive their seeds from it).
        local_steps: Local mini-batch steps per round.
        batch_size: Mini-batch size.
    """

    def __init__(
        self,
        nodes: NodeMap,
        sampler: TvStableSampler,
        *,
        seed: int,
        local_steps: int,
        batch_size: int,
    ) -> None:
        self.nodes = nodes
        self.sampler = sampler
        self.seed = seed
        self.local_steps = local_steps
        self.batch_size = batch_size
        self.draws: dict[int, ClientDraw] = {}

    def messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord
    ) -> tuple[list[Message], dict[int, str]]:
        """Return the round's train messages and the drawn clients no node hosts (why)."""
        draw = self.sampler.draw(server_round, self.nodes.present())
        self.draws[server_round] = draw
        out, missing = [], {}
        for cid, times in draw.multiplicity.items():
            node = self.nodes.nodes.get(cid)
            if node is None:
                missing[cid] = "no connected node hosts this client"
                continue
            own = ConfigRecord(
                {
                    **dict(config),
                    CONFIG_CLIENT: int(cid),
                    CONFIG_MULTIPLICITY: int(times),
                    CONFIG_RUN_SEED: int(self.seed),
                    CONFIG_ROUND: int(server_round),
                    LOCAL_STEPS: int(self.local_steps),
                    "batch-size": int(self.batch_size),
                    "local-epochs": 1,
                }
            )
            out.append(
                Message(
                    RecordDict({"arrays": arrays, "config": own}),
                    dst_node_id=node,
                    message_type="train",
                    group_id=str(server_round),
                )
            )
        return out, missing

    def aggregate(
        self,
        server_round: int,
        before: torch.Tensor,
        accepted: Mapping[int, Reply],
        aggregator: Aggregator,
    ) -> RoundRecord:
        """Return the round as the engine computes it from the accepted replies."""
        draw = self.draws[server_round]
        updates = [
            ClientUpdate(
                c, accepted[c].params - before, accepted[c].num_samples, accepted[c].loss or 0.0
            )
            for c in draw.ids
            if c in accepted
        ]
        return run_round(
            _Uploads(updates, int(before.numel())),  # type: ignore[arg-type]
            aggregator,
            before,
            server_round,
            draw,
        )


def weigh_by_multiplicity(
    replies: list[Message], draw: ClientDraw, weight_key: str
) -> list[Message]:
    """Return the replies with their sample count replaced by the client's multiplicity.

    The strategy then aggregates the round's metrics as the round's model is aggregated (by
    the draws each client won, never by its data size).
    """
    out = []
    for reply in replies:
        cid = reply_client(reply)
        for name, record in list(reply.content.metric_records.items()):
            values = dict(record)
            values[weight_key] = int(draw.multiplicity.get(cid, 1) if cid is not None else 1)
            reply.content[name] = MetricRecord(values)
        out.append(reply)
    return out


def tv_rounds(  # noqa: PLR0913 - what fixes the run's deletion-ready rounds
    grid: Grid,
    settings: TrainSettings,
    *,
    participation: float,
    num_clients: int | None,
    min_nodes: int,
    node_timeout: float,
) -> tuple[TvRounds, int]:
    """Place the app's clients and fix K; return the rounds and the run's client count.

    Waits for ``min_nodes`` nodes (the strategy's ``min_available_nodes``); the clients they
    host are the run's (``num_clients`` overrides their count, which fixes K).

    Raises:
        ConfigError: no connected node says which clients it hosts.
    """
    assert settings.local_steps is not None
    nodes = NodeMap(grid, node_timeout=node_timeout)
    nodes.wait_for(max(1, min_nodes))
    present = nodes.present()
    if not present:
        raise ConfigError(
            "sampling tv_stable: no connected node said which clients it hosts (build the "
            "ClientApp with fedunlearn's ClientApp)"
        )
    count = num_clients or len(present)
    rounds = TvRounds(
        nodes,
        TvStableSampler(tv_clients_per_round(participation, count), settings.seed),
        seed=settings.seed,
        local_steps=settings.local_steps,
        batch_size=settings.batch_size,
    )
    return rounds, count
