"""Derived seeds: every random choice is a pure function of (run seed, purpose, round, client).

This is what makes ``train --resume`` reach the bit-identical model of an uninterrupted run: no
random state is carried from one round to the next.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

_PURPOSES = {"client": 1, "sampling": 2, "attack": 3, "partition": 4, "model": 5, "misc": 6}


def derive_seed(seed: int, purpose: str, *keys: int) -> int:
    """Return a 63-bit seed derived from ``seed``, a purpose name and integer keys."""
    entropy = [int(seed) & 0xFFFFFFFFFFFFFFFF, _PURPOSES.get(purpose, 0), *map(int, keys)]
    if purpose not in _PURPOSES:
        digest = hashlib.sha256(purpose.encode()).digest()
        entropy.append(int.from_bytes(digest[:8], "little"))
    state = np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1])) & 0x7FFFFFFFFFFFFFFF


def torch_generator(seed: int) -> torch.Generator:
    """Return a CPU ``torch.Generator`` seeded with ``seed``."""
    g = torch.Generator()
    g.manual_seed(seed)
    return g
