"""The planner's inputs: a run's clients, sizes, sampler and shards, read from a config."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from fedunlearn.fl.sampling import tv_clients_per_round
from fedunlearn.runs.plan.formulas import (
    client_round_probability,
    expected_distinct_clients,
    fraction_round_probability,
    hypergeometric,
    sample_use_probability,
)
from fedunlearn.runs.setup import shard_plan

if TYPE_CHECKING:
    from fedunlearn.config import RunConfig

__all__ = ["PlanInputs", "Shard"]

# ----- inputs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shard:
    """A shard as trained: its clients, and its draws per round (K_s or n_s, frozen)."""

    clients: tuple[int, ...]
    draws: int

    @property
    def size(self) -> int:
        """M_s."""
        return len(self.clients)


@dataclass(frozen=True)
class PlanInputs:
    """What the planner reads from a config and its partition.

    Attributes:
        client_sizes: N_k of clients 0..M-1 (their training samples).
        rounds: R, the run's rounds.
        sampling: ``tv_stable`` (K draws with replacement, E mini-batch steps) or ``fraction``
            (``ceil(p M)`` clients without replacement, local epochs over all their data).
        participation: p (``training.participation``).
        batch_size: b.
        local_steps: E (needed by ``tv_stable``); None: local epochs (every sample read).
        shard_of: Each client's shard (empty: one shard).
        num_params: The model's parameter count (for bytes); None: unknown.
    """

    client_sizes: tuple[int, ...]
    rounds: int
    sampling: Literal["tv_stable", "fraction"]
    participation: float
    batch_size: int
    local_steps: int | None = None
    shard_of: tuple[int, ...] = ()
    num_params: int | None = None

    def __post_init__(self) -> None:
        if len(self.client_sizes) < 2:
            raise ValueError("the planner needs at least two clients (one must remain)")
        if not self.shard_of:
            object.__setattr__(self, "shard_of", (0,) * len(self.client_sizes))
        if len(self.shard_of) != len(self.client_sizes):
            raise ValueError("shard_of must name a shard for every client")
        if self.sampling == "tv_stable" and self.local_steps is None:
            raise ValueError("tv_stable sampling needs local_steps (E)")

    @classmethod
    def from_config(
        cls,
        config: RunConfig,
        client_sizes: Sequence[int],
        num_params: int | None = None,
        *,
        sampling: Literal["tv_stable", "fraction"] | None = None,
    ) -> PlanInputs:
        """Read R, p, b, E, the sampler and the shards from ``config`` (``sampling`` overrides).

        With ``sampling='tv_stable'`` on a fraction config, E is ``training.local_steps`` or 1
        (client-level figures do not depend on it).
        """
        tr = config.training
        kind = sampling or tr.sampling
        shards = shard_plan(config)
        return cls(
            client_sizes=tuple(int(n) for n in client_sizes),
            rounds=tr.rounds,
            sampling=kind,
            participation=tr.participation,
            batch_size=tr.batch_size,
            local_steps=(tr.local_steps or 1) if kind == "tv_stable" else tr.local_steps,
            shard_of=()
            if shards is None
            else tuple(shards.shard_of[c] for c in range(len(client_sizes))),
            num_params=num_params,
        )

    @property
    def num_clients(self) -> int:
        """M."""
        return len(self.client_sizes)

    @property
    def tv_stable(self) -> bool:
        """Whether the run draws with replacement and local mini-batch steps."""
        return self.sampling == "tv_stable"

    def request_round(self, after_round: int | None) -> int:
        """r_u: ``after_round``, or R (a request after training).

        Raises:
            ValueError: ``after_round`` < 1.
        """
        r_u = self.rounds if after_round is None else after_round
        if r_u < 1:
            raise ValueError(f"a request comes after round 1 or later; got {r_u}")
        return r_u

    def shards(self) -> list[Shard]:
        """The shards with their clients and frozen draws per round."""
        members: dict[int, list[int]] = {}
        for client, shard in enumerate(self.shard_of):
            members.setdefault(shard, []).append(client)
        return [Shard(tuple(ms), self._draws(len(ms))) for _, ms in sorted(members.items())]

    def _draws(self, size: int) -> int:
        if self.tv_stable:
            return tv_clients_per_round(self.participation, size)
        return max(1, math.ceil(self.participation * size))

    def draws_per_round(self) -> int:
        """K (TV-stable) or n (fraction) of the whole run, summed over shards."""
        return sum(s.draws for s in self.shards())

    def round_probability(self, shard: Shard, current: float, clients: int = 1) -> float:
        """q: a round of ``shard`` (``current`` clients left) draws one of ``clients``."""
        if self.tv_stable:
            return client_round_probability(current, shard.draws, clients)
        # the original participants minus the forgotten: P(a client is drawn) stays n_s / M_s
        return fraction_round_probability(shard.size, shard.draws, clients)

    def work(self, shard: Shard, current: float) -> float:
        """Expected client trajectories per round of ``shard`` with ``current`` clients left."""
        if self.tv_stable:
            return expected_distinct_clients(current, shard.draws)
        return shard.draws * current / shard.size

    def sample_use(self, client: int, samples: int = 1) -> float:
        """u_k(s); 1 with local epochs (every local epoch reads every sample)."""
        if self.local_steps is None:
            return 1.0
        return sample_use_probability(
            self.client_sizes[client], self.batch_size, self.local_steps, samples
        )

    def rho_client(self, after_round: int) -> float:
        """Nominal ρ_C = K r_u / M (the largest over shards): a client's expected draws."""
        return max(s.draws * after_round / s.size for s in self.shards())

    def rho_sample(self, client: int, after_round: int) -> float | None:
        """Nominal ρ_S,k = r_u K E b / (M N_k) in the client's shard; None without E."""
        if self.local_steps is None:
            return None
        shard = self.shard_of_client(client)
        return (
            after_round
            * shard.draws
            * self.local_steps
            * self.batch_size
            / (shard.size * self.client_sizes[client])
        )

    def shard_of_client(self, client: int) -> Shard:
        """The shard that holds ``client``."""
        return next(s for s in self.shards() if client in s.clients)

    def worst_client(self) -> int:
        """The client of largest ρ_S (smallest N_k relative to its shard's draws)."""
        return max(
            range(self.num_clients),
            key=lambda c: (self.rho_sample(c, 1) or 0.0, -self.client_sizes[c], -c),
        )

    def retrain_work(self, after_round: int, clients: int = 0) -> float:
        """Retrain's expected trajectories: all shards, r_u rounds, ``clients`` random ones gone."""
        total = 0.0
        for shard in self.shards():
            for hits in range(min(clients, shard.size) + 1):
                p = hypergeometric(self.num_clients, shard.size, clients, hits)
                total += p * self.work(shard, shard.size - hits) if p else 0.0
        return after_round * total
