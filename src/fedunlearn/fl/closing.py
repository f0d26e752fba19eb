"""``Closing``: the context-manager half of a class that has a ``close`` method.

``with obj:`` returns ``obj`` and calls ``obj.close()`` on the way out, whatever happened;
``close`` must be safe to call again.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["Closing"]


class Closing:
    """Mixin: ``__enter__`` returns self, ``__exit__`` calls ``close`` (never swallows)."""

    def close(self) -> None:
        """Release what the object holds; calling it again does nothing."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
