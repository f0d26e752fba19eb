"""Atomic file writes: a reader sees the old file or the new one, never a part.

Below every layer (like ``errors``): the run directory (``runs.rundir``) and the TLS identity
files (``mpc.identity``) write through it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["write_bytes_atomic"]


def write_bytes_atomic(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` atomically, following no link.

    The data goes to a fresh temporary name in the same directory (``tempfile.mkstemp``: a
    random name created with O_EXCL and, where the system has it, O_NOFOLLOW, mode 0600, so a
    leftover ``*.tmp`` or a planted symlink is never opened), is fsync'd, and replaces ``path``
    by a rename (which replaces a symlink at ``path`` itself instead of writing through it).
    Nothing is left under the temporary name, whatever fails.

    Args:
        path: The file to write.
        data: Its new content.
        mode: The file's exact mode, whatever the umask (set by ``fchmod`` before any byte is
            written); None: mkstemp's 0600.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
