"""Helpers shared by several test packages (import as ``tests.support``)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def digest(run_dir: Path) -> str:
    """Return a hash of a run directory's content (WAL side files that hold no data excluded)."""
    h = hashlib.sha256()
    for path in sorted(run_dir.rglob("*")):
        # a WAL reader creates an empty -wal and a -shm index next to the database: not content
        empty_wal = path.name.endswith("-wal") and path.stat().st_size == 0
        if path.is_file() and not path.name.endswith((".lock", "-shm")) and not empty_wal:
            h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()
