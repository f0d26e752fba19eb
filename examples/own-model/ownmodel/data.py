"""The data: an .npz of 8x8 images (``x``, ``y``), split into clients and a test set here.

``python -m ownmodel.data`` writes ``data/patterns.npz`` (4 classes of noisy stripe patterns, a
stand-in for your own files). ``load`` is the data source fedunlearn calls.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def write(path: str | Path = "data/patterns.npz", samples: int = 720, seed: int = 0) -> Path:
    """Write ``samples`` noisy 1x8x8 images of 4 stripe patterns to ``path``."""
    rng = np.random.default_rng(seed)
    patterns = np.zeros((4, 8, 8), dtype=np.float32)
    patterns[0, ::2, :] = 1  # horizontal stripes
    patterns[1, :, ::2] = 1  # vertical stripes
    patterns[2][np.eye(8, dtype=bool)] = 1  # diagonal
    patterns[3, 2:6, 2:6] = 1  # a square
    y = rng.integers(0, 4, size=samples)
    x = patterns[y] + rng.normal(0, 0.6, size=(samples, 8, 8)).astype(np.float32)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=x[:, None].astype(np.float32), y=y.astype(np.int64))
    return path


def load(num_clients: int, seed: int, path: str = "data/patterns.npz", test_fraction: float = 0.2):
    """The data source fedunlearn calls: ``(num_clients, seed, **options)``.

    Returns the plain mapping fedunlearn accepts: each client's ``(x, y)``, the test set, and
    a held-out set per client (samples it never trains on, for membership checks).
    """
    with np.load(path) as f:
        x, y = f["x"], f["y"]
    order = np.random.default_rng(seed).permutation(len(y))
    test = order[: int(len(y) * test_fraction)]
    rest = order[len(test) :]
    shards = np.array_split(rest, num_clients)
    clients, held_out = {}, {}
    for c, shard in enumerate(shards):
        cut = len(shard) * 4 // 5
        clients[c] = (x[shard[:cut]], y[shard[:cut]])
        held_out[c] = (x[shard[cut:]], y[shard[cut:]])
    return {"clients": clients, "test": (x[test], y[test]), "held_out": held_out}


if __name__ == "__main__":
    print(write(*sys.argv[1:2]))
