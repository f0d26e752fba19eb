"""Who trains in a round and on which samples: the client samplers and deletion-consistent draws.

Two client samplers (``ClientSampler``):

- ``FractionSampler``: the default. A seeded ``ceil(fraction * |present|)`` clients without
  replacement (``fl.engine.sample_clients``), each weighted by its sample count n_c in FedAvg.
- ``TvStableSampler``: FATS's sampling (Tao et al., "Communication Efficient and Provable
  Federated Unlearning", PVLDB 17(5) 2024, Alg. 1 line 8): a multiset of K draws *with
  replacement* per round, each client weighted by its multiplicity m/K (Eq. 6), never by n_c,
  so that a client's data size does not enter the update (the invariant exactness rests on:
  docs/deletion_ready.md, "What exact means").

Deletion-consistent draws (docs/deletion_ready.md, "Randomness"): every draw is an argmin of
keys, and each key is a pure function of a stream seed and the *id* of the candidate (a client
id, or a sample's stable id within its client), never of its position. Slot j of round r picks
the present client with the smallest ``key(stream(r, j), client)``; a local step picks the b
samples with the smallest ``key(stream(task, i), sample)``, in sample-id order. So removing a
client or a sample changes exactly the draws it had won (a slot moves to the next-smallest key,
a batch takes the (b+1)-th sample), and replaying the same seed on the reduced data reproduces
every other draw bit for bit: unlearning is "replay from the first round that used the item".

Keys: the SplitMix64 finalizer (Steele, Lea, Flood, "Fast splittable pseudorandom number
generators", OOPSLA 2014) of the id mixed with the stream seed. The finalizer is a bijection of
64-bit words, so distinct ids always get distinct keys (no ties), and a draw costs O(present
items), with no id space to store. Deviation from the spec's Philox key matrix over the original
id space: [REC] the same property without storing M0 or N0_k, and O(K x present) instead of
O(K x M0) per round.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

import numpy as np

from fedunlearn.errors import ConfigError
from fedunlearn.fl.seeding import derive_seed

__all__ = [
    "ClientDraw",
    "ClientSampler",
    "FractionSampler",
    "TvStableSampler",
    "batches_use",
    "item_keys",
    "step_batches",
    "tv_clients_per_round",
]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on a uint64 array (a bijection; wraps modulo 2^64)."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    out: np.ndarray = x ^ (x >> np.uint64(31))
    return out


def item_keys(stream: int | np.ndarray, ids: np.ndarray | Sequence[int]) -> np.ndarray:
    """Return the uint64 key of each id in one draw stream (distinct ids, distinct keys).

    ``stream`` may be a uint64 array of streams: the keys then have shape
    ``(*stream.shape, len(ids))`` (many draws at once, ``fedunlearn.eval.exactness``).
    """
    ids64 = np.asarray(ids, dtype=np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        if isinstance(stream, np.ndarray):
            return _mix64(_mix64(ids64) ^ stream.astype(np.uint64)[..., None])
        return _mix64(_mix64(ids64) ^ np.uint64(stream & 0xFFFFFFFFFFFFFFFF))


@dataclass(frozen=True)
class ClientDraw:
    """One round's participants: each drawn client once, with its multiplicity.

    Attributes:
        multiplicity: Client -> how many of the round's draws it won (1 without replacement).
        size_weighted: True: FedAvg weighs each upload by n_c (the default sampler); False: by
            multiplicity (TV-stable sampling: a client's data size never enters the update).
    """

    multiplicity: Mapping[int, int]
    size_weighted: bool = True
    _ids: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        counts = {int(c): int(m) for c, m in sorted(self.multiplicity.items())}
        if any(m < 1 for m in counts.values()):
            raise ConfigError(f"multiplicities must be >= 1; got {counts}")
        object.__setattr__(self, "multiplicity", MappingProxyType(counts))
        object.__setattr__(self, "_ids", tuple(counts))

    @property
    def ids(self) -> tuple[int, ...]:
        """The distinct participants, sorted (the order clients are asked in)."""
        return self._ids

    def weights(self) -> Mapping[int, float] | None:
        """Aggregation weight per client, or None for FedAvg's n_c."""
        if self.size_weighted:
            return None
        return {c: float(m) for c, m in self.multiplicity.items()}


class ClientSampler(Protocol):
    """Draws a round's participants among the clients present."""

    @property
    def name(self) -> str:
        """The sampler's name (``training.sampling``)."""
        ...

    def draw(self, round_: int, present: Sequence[int]) -> ClientDraw:
        """Return round ``round_``'s participants among ``present`` (any order)."""
        ...


def _fraction_ids(ids: Sequence[int], fraction: float, seed: int) -> list[int]:
    count = max(1, math.ceil(fraction * len(ids)))
    rng = np.random.default_rng(seed)
    return sorted(int(c) for c in rng.choice(ids, size=count, replace=False))


@dataclass(frozen=True)
class FractionSampler:
    """A seeded fraction of the present clients, without replacement (the default sampler).

    Args:
        fraction: Share of the present clients sampled per round, in (0, 1]; at least one.
        seed: The run seed.
        key: Extra seed keys (a shard's index); empty for an unsharded run, whose draws are
            those of ``fl.engine.sample_clients``.
    """

    fraction: float
    seed: int
    key: tuple[int, ...] = ()
    name: str = "fraction"

    def __post_init__(self) -> None:
        if not 0 < self.fraction <= 1:
            raise ConfigError(f"participation fraction must be in (0, 1]; got {self.fraction}")

    def draw(self, round_: int, present: Sequence[int]) -> ClientDraw:
        """Return a seeded fraction of ``present`` (all of them at fraction 1)."""
        ids = sorted(int(c) for c in present)
        if not ids:
            return ClientDraw({})
        if self.fraction < 1:
            ids = _fraction_ids(
                ids, self.fraction, derive_seed(self.seed, "sampling", round_, *self.key)
            )
        return ClientDraw(dict.fromkeys(ids, 1))


@dataclass(frozen=True)
class TvStableSampler:
    """FATS's client multiset: K draws with replacement, deletion-consistent (module doc).

    Args:
        clients_per_round: K, draws per round (frozen for the run: never recomputed from the
            current number of clients, FATS pitfall 3 in docs/deletion_ready.md).
        seed: The run seed.
        key: Extra seed keys (a shard's index).
    """

    clients_per_round: int
    seed: int
    key: tuple[int, ...] = ()
    name: str = "tv_stable"

    def __post_init__(self) -> None:
        if self.clients_per_round < 1:
            raise ConfigError(f"clients per round must be >= 1; got {self.clients_per_round}")

    def draw(self, round_: int, present: Sequence[int]) -> ClientDraw:
        """Return the round's multiset: slot j takes the present client of smallest key."""
        ids = np.array(sorted({int(c) for c in present}), dtype=np.int64)
        if ids.size == 0:
            return ClientDraw({}, size_weighted=False)
        winners = [
            int(ids[int(np.argmin(item_keys(self._stream(round_, j), ids)))])
            for j in range(self.clients_per_round)
        ]
        return ClientDraw(Counter(winners), size_weighted=False)

    def _stream(self, round_: int, slot: int) -> int:
        return derive_seed(self.seed, "tv_clients", round_, slot, *self.key)


def tv_clients_per_round(participation: float, num_clients: int) -> int:
    """Return K for TV-stable sampling: ``participation`` of the run's clients, at least one."""
    return max(1, round(participation * num_clients))


def step_batches(
    seed: int, sample_ids: np.ndarray | Sequence[int], batch_size: int, steps: int
) -> list[np.ndarray]:
    """Return the positions of each local step's mini-batch (FATS Alg. 1 line 12).

    Step i takes the ``batch_size`` samples whose ``item_keys(stream(seed, i), id)`` are
    smallest, in sample-id order (a canonical summation order), drawn afresh each step without
    replacement within the step. Positions index the client's current data, whose ids are
    ``sample_ids`` (ascending).

    Raises:
        ConfigError: if the client holds fewer than ``batch_size`` samples.
    """
    ids = np.asarray(sample_ids, dtype=np.int64)
    if ids.size < batch_size:
        raise ConfigError(
            f"a client holds {ids.size} samples, fewer than the mini-batch of {batch_size} that "
            "TV-stable local steps draw without replacement; lower training.batch_size or give "
            "every client at least that many samples"
        )
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    batches = []
    for step in range(steps):
        keys = item_keys(derive_seed(seed, "tv_batch", step), sorted_ids)
        chosen = np.sort(np.argpartition(keys, batch_size - 1)[:batch_size])
        batches.append(order[chosen])
    return batches


def batches_use(
    seed: int,
    sample_ids: np.ndarray | Sequence[int],
    targets: Collection[int],
    batch_size: int,
    steps: int | None,
) -> bool:
    """Return whether one client's local training in one round drew any of ``targets``.

    Step mode (``steps``): whether a target is in one of the ``step_batches``. Epoch mode
    (``steps`` None): every epoch passes over all the client's data, so any target it holds.
    """
    ids = np.asarray(sample_ids, dtype=np.int64)
    wanted = np.asarray(sorted(targets), dtype=np.int64)
    if steps is None:
        return bool(np.isin(wanted, ids).any())
    drawn = np.concatenate(step_batches(seed, ids, batch_size, steps))
    return bool(np.isin(ids[drawn], wanted).any())
