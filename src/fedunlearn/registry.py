"""One registry type for everything looked up by name (methods, recording policies, hooks).

A ``Registry`` maps a name to a value (a class, a spec). Names are registered with the ``register``
decorator or ``add``; ``get`` raises a subclass of ``UnknownNameError`` that lists what is
available. A registry of a plugin kind (``plugin_kind``: ``methods``, ``central_methods``,
``policies``, ``budget_schedules``) also knows the names installed plugins declare
(``fedunlearn.plugins``): on the first lookup of such a name it imports the one module that defines
it and registers the value. So a recording policy defined in the Crab package can be named in a run
config that ``fedunlearn.runs`` trains without ``runs`` importing the package, and listing the names
reads only the plugins' declarations. ``ClassRegistry`` is the registry of classes that carry their
registered ``name`` and are built from a params mapping (unlearning and centralised methods).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from fedunlearn import plugins
from fedunlearn.errors import UnknownNameError

T = TypeVar("T")
V = TypeVar("V")


class Registry(Generic[T]):
    """Values of one kind, registered by name.

    Args:
        kind: What the values are, for messages ("unlearning method").
        error: The ``UnknownNameError`` subclass raised by ``get``.
        plugin_kind: The ``fedunlearn.plugins.Plugin`` field whose names this registry also
            serves (resolved on first lookup), or None.
        lazy: ``name -> "module:attr"`` values resolved on first lookup (a package's own
            optional pieces, e.g. a backend whose module is heavy).
    """

    def __init__(
        self,
        kind: str,
        error: type[UnknownNameError] = UnknownNameError,
        plugin_kind: plugins.Kind | None = None,
        lazy: Mapping[str, str] | None = None,
    ) -> None:
        self.kind = kind
        self._error = error
        self._plugin_kind: plugins.Kind | None = plugin_kind
        self._lazy = dict(lazy or {})
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
        if name not in self._values:
            self._load(name)
        if name not in self._values:
            raise self._error(
                f"unknown {self.kind} '{name}'; available: {', '.join(self.names())}"
                f"{self._install_hint()}"
            )
        return self._values[name]

    def _install_hint(self) -> str:
        """Say how to install the plugins when none declares a name of this registry's kind."""
        kind = self._plugin_kind
        if kind is None:
            return ""
        if not plugins.installed():
            return (
                f" (no {plugins.ENTRY_POINT_GROUP} entry points are installed: install "
                "fedunlearn, e.g. pip install -e . in its repository, so its method "
                "packages are found)"
            )
        if not plugins.declared(kind):  # installed metadata older than this kind's plugins
            return (
                f" (no installed {plugins.ENTRY_POINT_GROUP} entry point declares a {self.kind}: "
                "reinstall fedunlearn, e.g. pip install -e . in its repository)"
            )
        return ""

    def _load(self, name: str) -> None:
        """Register ``name`` from its lazy path, or the installed plugin that declares it."""
        if name in self._lazy:
            path, what = self._lazy[name], f"{self.kind} '{name}'"
        else:
            kind = self._plugin_kind
            found = plugins.provider(kind, name) if kind is not None else None
            if found is None:
                return
            path, what = found[1], f"{self.kind} '{name}' of plugin '{found[0].name}'"
        value = plugins.resolve(path, what)
        if self._values.get(name) is not value:  # importing it may have registered it already
            self.add(name, value)

    def _declared(self) -> set[str]:
        kind = self._plugin_kind
        return set(self._lazy) | (plugins.declared(kind) if kind is not None else set())

    def names(self) -> list[str]:
        """Return the registered names and those installed plugins declare, sorted."""
        return sorted(set(self._values) | self._declared())

    def __contains__(self, name: object) -> bool:
        return name in self._values or name in self._declared()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())


C = TypeVar("C", bound=type)


class ClassRegistry(Registry[C]):
    """Classes registered by name, each told its name and built from a params mapping.

    The registry of unlearning methods (``fedunlearn.unlearn.registry``) and of centralised
    methods (``fedunlearn.central.registry``): ``register`` (class decorator), ``get``,
    ``make`` and ``names``; registering a class sets its ``name`` attribute to its key.
    """

    def add(self, name: str, value: C) -> C:
        """Register class ``value`` as ``name`` and set ``value.name = name``."""
        super().add(name, value)
        value.name = name  # type: ignore[attr-defined]
        return value

    def make(self, name: str, params: Mapping[str, Any] | None = None) -> Any:
        """Build the class registered as ``name`` with hyperparameters ``params``.

        Raises:
            UnknownNameError: (the registry's subclass) if ``name`` is not registered.
            ConfigError: on invalid hyperparameters (the class validates them).
        """
        return self.get(name)(dict(params or {}))
