"""Pseudo-random ring elements from a 16-byte seed, AES-128 in counter mode.

A seed stands in for a whole array of shares: the dealer sends seeds instead of random shares,
which is what makes the offline phase cheap (MPC2 in docs/mpc.md). Expansion writes the key
stream into a preallocated buffer with ``update_into``.

Paper: Liu et al., Starfish, Table IV and App. B-B item 1 (ZeroGen, SecRanGen); the offline
phase of Alg. 4 line 12.
"""

from __future__ import annotations

import hashlib
import secrets

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from numpy.typing import NDArray

__all__ = ["SEED_BYTES", "Prg", "derive_seed", "expand_seed", "fresh_seed"]

SEED_BYTES = 16
_BLOCK = 16
_ZERO_NONCE = bytes(_BLOCK)


_ZEROS = [memoryview(bytes(1 << 20))]


def _zeros(nbytes: int) -> memoryview:
    """A read-only view of ``nbytes`` zero bytes (the plaintext of the key stream), reused."""
    zeros = _ZEROS[0]
    if len(zeros) < nbytes:
        zeros = memoryview(bytes(max(nbytes, 2 * len(zeros))))
        _ZEROS[0] = zeros
    return zeros[:nbytes]


def fresh_seed() -> bytes:
    """Return a new random 16-byte seed from the operating system."""
    return secrets.token_bytes(SEED_BYTES)


def derive_seed(master: bytes, *labels: object) -> bytes:
    """Derive an independent 16-byte seed from a master seed and labels (BLAKE2b)."""
    h = hashlib.blake2b(master, digest_size=SEED_BYTES, person=b"fedunlearn-mpc")
    for label in labels:
        h.update(repr(label).encode() + b"\x00")
    return h.digest()


class Prg:
    """A stream of uniform uint64 words: AES-128-CTR keyed by the seed, counter from zero.

    Args:
        seed: 16-byte key.
    """

    def __init__(self, seed: bytes) -> None:
        if len(seed) != SEED_BYTES:
            raise ValueError(f"a PRG seed has {SEED_BYTES} bytes; got {len(seed)}")
        self._encryptor = Cipher(algorithms.AES(seed), modes.CTR(_ZERO_NONCE)).encryptor()

    def words(self, count: int) -> NDArray[np.uint64]:
        """Return the next ``count`` words of the stream."""
        nbytes = 8 * count
        out = np.empty(nbytes + _BLOCK, dtype=np.uint8)  # update_into wants block_size - 1 spare
        # a uint8 array is a writable buffer; the stub names bytes/bytearray/memoryview only
        self._encryptor.update_into(_zeros(nbytes), out)  # type: ignore[arg-type]
        return out[:nbytes].view(np.uint64)

    def ring(self, shape: tuple[int, ...]) -> NDArray[np.uint64]:
        """Return uniform ring elements of the given shape."""
        return self.words(int(np.prod(shape, dtype=np.int64))).reshape(shape)


def expand_seed(seed: bytes, count: int) -> NDArray[np.uint64]:
    """Expand a seed into ``count`` uniform uint64 words (the first words of its stream)."""
    return Prg(seed).words(count)
