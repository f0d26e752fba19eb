"""One registry type for everything looked up by name (methods, recording policies).

A ``Registry`` maps a name to a value (a class, a spec). Names are registered with the
``register`` decorator or ``add``; ``get`` raises a subclass of ``UnknownNameError`` that lists
what is available. A registry may name *plugin modules*: on the first lookup of a name it does not
know, it imports them once (they register themselves on import) and looks again. The built-in
method packages reach the lower layers this way, so that a recording policy defined in
``fedunlearn.unlearn.crab`` can be named in a run config that ``fedunlearn.runs`` trains, without
``runs`` importing ``unlearn``. Third-party packages add theirs through the entry-point group
``fedunlearn.plugins`` (each entry names a module to import).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from fedunlearn.errors import UnknownNameError

T = TypeVar("T")
V = TypeVar("V")

ENTRY_POINT_GROUP = "fedunlearn.plugins"
BUILTIN_PLUGINS = ("fedunlearn.unlearn",)
_loaded = False


def load_plugins() -> None:
    """Import the built-in method packages and every ``fedunlearn.plugins`` entry point, once."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in BUILTIN_PLUGINS:
        importlib.import_module(module)
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        importlib.import_module(entry.value)


class Registry(Generic[T]):
    """Values of one kind, registered by name.

    Args:
        kind: What the values are, for messages ("unlearning method").
        error: The ``UnknownNameError`` subclass raised by ``get``.
        plugins: Whether a miss imports the plugin modules and looks again.
    """

    def __init__(
        self, kind: str, error: type[UnknownNameError] = UnknownNameError, plugins: bool = False
    ) -> None:
        self.kind = kind
        self._error = error
        self._plugins = plugins
        self._values: dict[str, T] = {}

    def add(self, name: str, value: T) -> T:
        """Register ``value`` as ``name``; registering a different value twice is an error."""
        if not name or not name.replace("_", "").isalnum() or name != name.lower():
            raise ValueError(f"{self.kind} name {name!r} must be lower-case letters, digits, _")
        if name in self._values and self._values[name] is not value:
            raise ValueError(f"{self.kind} name '{name}' is registered twice")
        self._values[name] = value
        return value

    def register(self, name: str) -> Callable[[V], V]:
        """Decorator form of ``add``."""

        def decorate(value: V) -> V:
            self.add(name, value)  # type: ignore[arg-type]
            return value

        return decorate

    @contextmanager
    def registered(self, name: str, value: T) -> Iterator[T]:
        """Register ``value`` as ``name`` for the duration of a ``with`` block (tests, examples)."""
        self.add(name, value)
        try:
            yield value
        finally:
            self._values.pop(name, None)

    def get(self, name: str) -> T:
        """Return the value registered as ``name``.

        Raises:
            UnknownNameError: (the registry's subclass) naming the available names.
        """
        if name not in self._values and self._plugins:
            load_plugins()
        if name not in self._values:
            raise self._error(
                f"unknown {self.kind} '{name}'; available: {', '.join(self.names())}"
            )
        return self._values[name]

    def names(self) -> list[str]:
        """Return the registered names, sorted (plugins loaded first)."""
        if self._plugins:
            load_plugins()
        return sorted(self._values)

    def __contains__(self, name: object) -> bool:
        if self._plugins and name not in self._values:
            load_plugins()
        return name in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())
