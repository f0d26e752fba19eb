"""The library's seeded draws, many seeds at once: a fast path for the exactness tests.

TV-stable training draws every round's client multiset and every local mini-batch from seeds
(``fedunlearn.fl.sampling``): slot j of round r takes the present client of smallest
``item_keys(derive_seed(seed, "tv_clients", r, j), client)``, and step i of client c in round r
takes the b samples of smallest ``item_keys(derive_seed(derive_seed(seed, "client", r, c, 0),
"tv_batch", i), sample id)``. A statistical test of those laws needs 10^4-10^5 histories, and
``derive_seed`` (numpy's ``SeedSequence``) costs ~30 us a call. This module computes the same
seeds for whole arrays at once: ``derive_seeds`` is numpy's ``SeedSequence`` entropy mixing
(O'Neill's seed_seq hash, as numpy implements it) written on uint32 arrays, and
``client_slots`` / ``batch_members`` take the argmin of ``item_keys`` over arrays of streams.
Tests check every function against the library's own samplers draw for draw
(tests/eval/test_exactness.py); the statistical tests then use the fast path.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from fedunlearn.fl.sampling import item_keys
from fedunlearn.fl.seeding import _PURPOSES  # the seeds' purpose codes, shared on purpose

__all__ = ["batch_members", "client_seeds", "client_slots", "derive_seeds"]

# numpy.random.SeedSequence's constants (bit_generator.pyx), pool of 4 uint32 words
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_MULT_L, _MIX_MULT_R = 0xCA01F9DD, 0x4973F715
_POOL = 4
_MASK32 = 0xFFFFFFFF
_U32 = np.uint32


def _hash_consts(count: int) -> list[np.uint32]:
    """The successive hash constants of ``count`` hashmix calls (they do not depend on data)."""
    consts, value = [], _INIT_A
    for _ in range(count):
        consts.append(_U32(value))
        value = (value * _MULT_A) & _MASK32
    return consts


def _hashmix(value: np.ndarray, const: np.uint32) -> np.ndarray:
    value = value ^ const
    value = value * _U32((int(const) * _MULT_A) & _MASK32)
    return value ^ (value >> _U32(16))


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    result: np.ndarray = _U32(_MIX_MULT_L) * x - _U32(_MIX_MULT_R) * y
    return result ^ (result >> _U32(16))


def _seed_state(words: np.ndarray) -> np.ndarray:
    """``SeedSequence(entropy).generate_state(2)`` for each row of uint32 ``words`` (n, L)."""
    length = words.shape[1]
    consts = iter(_hash_consts(_POOL + _POOL * (_POOL - 1) + _POOL * max(0, length - _POOL)))
    zero = np.zeros(words.shape[0], dtype=_U32)
    mixer = [_hashmix(words[:, i] if i < length else zero, next(consts)) for i in range(_POOL)]
    for src in range(_POOL):
        for dst in range(_POOL):
            if src != dst:
                mixer[dst] = _mix(mixer[dst], _hashmix(mixer[src], next(consts)))
    for src in range(_POOL, length):
        for dst in range(_POOL):
            mixer[dst] = _mix(mixer[dst], _hashmix(words[:, src], next(consts)))
    state, const = [], _INIT_B
    for i in range(2):
        value = mixer[i % _POOL] ^ _U32(const)
        const = (const * _MULT_B) & _MASK32
        value = value * _U32(const)
        state.append(value ^ (value >> _U32(16)))
    return np.stack(state, axis=1)


def derive_seeds(seeds: np.ndarray | int, purpose: str, *keys: np.ndarray | int) -> np.ndarray:
    """Return ``fl.seeding.derive_seed(seed, purpose, *keys)`` for arrays of seeds and keys.

    Args:
        seeds: Run seeds (any shape; broadcast with ``keys``), below 2^64.
        purpose: The purpose name (as ``derive_seed`` takes it).
        keys: Integer keys below 2^64, arrays broadcast together with ``seeds``.

    Returns:
        A uint64 array of the broadcast shape: the derived 63-bit seeds.
    """
    columns: list[np.ndarray | np.uint64] = [
        np.asarray(seeds, dtype=np.uint64),
        np.uint64(_PURPOSES.get(purpose, 0)),
    ]
    columns += [np.asarray(k, dtype=np.uint64) for k in keys]
    if purpose not in _PURPOSES:
        digest = hashlib.sha256(purpose.encode()).digest()
        columns.append(np.uint64(int.from_bytes(digest[:8], "little")))
    flat = [c.ravel() for c in np.broadcast_arrays(*columns)]
    shape = np.broadcast_shapes(*(np.shape(c) for c in columns))
    # SeedSequence writes an integer as 1 uint32 word below 2^32, else 2 (low word first)
    code = np.zeros(flat[0].shape, dtype=np.int64)
    for bit, column in enumerate(flat):
        code |= (column > _MASK32).astype(np.int64) << bit
    out = np.empty(flat[0].shape, dtype=np.uint64)
    for pattern in np.unique(code):
        rows = np.nonzero(code == pattern)[0]
        words = []
        for bit, column in enumerate(flat):
            two = (int(pattern) >> bit) & 1
            values = column[rows]
            words.append((values & np.uint64(_MASK32)).astype(_U32))
            if two:
                words.append((values >> np.uint64(32)).astype(_U32))
        state = _seed_state(np.stack(words, axis=1)).astype(np.uint64)
        out[rows] = ((state[:, 0] << np.uint64(31)) ^ state[:, 1]) & np.uint64(2**63 - 1)
    return out.reshape(shape)


def client_slots(seeds: np.ndarray, rounds: int, draws: int, present: Sequence[int]) -> np.ndarray:
    """Return the clients that rounds 1..R's ``draws`` slots take (``TvStableSampler.draw``).

    Args:
        seeds: Run seeds, shape (n,).
        rounds: R.
        draws: K.
        present: The client ids present.

    Returns:
        Client ids, shape (n, R, K).
    """
    ids = np.asarray(sorted(int(c) for c in present), dtype=np.int64)
    r = np.arange(1, rounds + 1, dtype=np.uint64)[None, :, None]
    j = np.arange(draws, dtype=np.uint64)[None, None, :]
    streams = derive_seeds(np.asarray(seeds, dtype=np.uint64)[:, None, None], "tv_clients", r, j)
    return ids[np.argmin(item_keys(streams, ids), axis=-1)]


def client_seeds(seeds: np.ndarray, rounds: int, clients: Sequence[int]) -> np.ndarray:
    """Return each client's local-training seed per round, shape (n, R, C) (salt 0)."""
    r = np.arange(1, rounds + 1, dtype=np.uint64)[None, :, None]
    c = np.asarray(clients, dtype=np.uint64)[None, None, :]
    return derive_seeds(np.asarray(seeds, dtype=np.uint64)[:, None, None], "client", r, c, 0)


def batch_members(
    local_seeds: np.ndarray,
    sample_ids: Sequence[int],
    batch_size: int,
    steps: int,
    deleted: Sequence[int] = (),
) -> np.ndarray:
    """Return which samples each local step's mini-batch holds (``step_batches``).

    Args:
        local_seeds: Local-training seeds (any shape S).
        sample_ids: The client's sample ids as trained (the original data).
        batch_size: b.
        steps: E.
        deleted: Ids deleted (the reduced data's draws: they are never taken).

    Returns:
        A bool array of shape (*S, E, N): step i's batch holds sample ``sample_ids[k]``.
    """
    ids = np.asarray(sample_ids, dtype=np.int64)
    step = np.arange(steps, dtype=np.uint64)
    streams = derive_seeds(np.asarray(local_seeds, dtype=np.uint64)[..., None], "tv_batch", step)
    keys = item_keys(streams, ids)
    if len(deleted):
        keys[..., np.isin(ids, np.asarray(deleted, dtype=np.int64))] = np.uint64(2**64 - 1)
    if ids.size - len(deleted) < batch_size:
        raise ValueError(f"fewer than {batch_size} samples remain to draw a mini-batch from")
    chosen = np.argpartition(keys, batch_size - 1, axis=-1)[..., :batch_size]
    members = np.zeros(keys.shape, dtype=bool)
    np.put_along_axis(members, chosen, True, axis=-1)
    return members
