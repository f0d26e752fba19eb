"""The one-writer lock of a store directory (``flock``), composed into ``HistoryStore``."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from fedunlearn.errors import HistoryError
from fedunlearn.history.store.schema import LOCK_NAME

__all__ = ["WriterLock", "own_lock"]


class WriterLock:
    """The one-writer lock of a store directory: ``flock`` on ``<dir>/history.lock``.

    ``HistoryStore.create`` and ``open(writable=True)`` take it themselves; take it first only
    to hold it before the store exists, then pass it to them (they own it from then on).
    """

    def __init__(self, fd: int, path: Path) -> None:
        """Wrap a locked descriptor; use ``acquire`` instead."""
        self._fd: int | None = fd
        self.path = path

    @classmethod
    def acquire(cls, path: Path) -> WriterLock:
        """Take the writer lock of directory ``path`` (which must exist), without waiting.

        Raises:
            HistoryError: Another process holds it.
        """
        path = Path(path)
        fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise HistoryError(
                f"{path}: another writer holds {path / LOCK_NAME} (a train, resume or forget "
                "of this history); one writer at a time. Wait for it to finish, or open the store "
                "read-only meanwhile."
            ) from None
        return cls(fd, path)

    @property
    def held(self) -> bool:
        """Whether the lock is still held."""
        return self._fd is not None

    def release(self) -> None:
        """Release the lock; calling it again does nothing."""
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None


def own_lock(path: Path, lock: WriterLock | None) -> WriterLock:
    """Return ``lock`` (checked to be directory ``path``'s) or a freshly acquired one."""
    if lock is None:
        return WriterLock.acquire(path)
    if not lock.held or lock.path.resolve() != Path(path).resolve():
        lock.release()
        raise HistoryError(
            f"{path}: the writer lock handed in is not held for this directory "
            f"({lock.path}); take it with WriterLock.acquire({str(path)!r})."
        )
    return lock
