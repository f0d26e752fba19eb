"""The plugin seam: what a method package contributes, declared as strings, loaded by name.

A plugin is one installed entry point of the group ``fedunlearn.plugins`` whose value is a
``Plugin``: a frozen declaration that names, as ``"module:attr"`` strings, everything the package
contributes (its unlearning methods, centralised methods, recording policies with their options
models, training hooks such as a DP budget schedule, CLI commands). The declaration module imports
nothing but this module, so reading every installed declaration is cheap; a contribution's module is
imported only when its name is looked up (``provider``), by the ``Registry`` of its kind
(``fedunlearn.registry``). The core (``config``, ``fl``, ``history``, ``privacy``, ``runs``)
receives the specs through those registries and never names a plugin (an import-linter contract
keeps it so). The paper packages are plugins like any third-party one: their entry points are in
fedunlearn's own ``pyproject.toml``. Guide: docs/architecture.md ("The plugin seam").

Lookup order: a name is first looked for in the plugin whose entry-point name equals it (Crab's
policy ``crab`` in the plugin ``crab``: one declaration read), then in every installed
declaration; two plugins declaring one name is an error naming both.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from types import MappingProxyType
from typing import Any, Literal, get_args

from fedunlearn.errors import PluginError, UnknownNameError

__all__ = [
    "ENTRY_POINT_GROUP",
    "Kind",
    "Plugin",
    "cli_hooks",
    "declared",
    "installed",
    "load",
    "provider",
    "resolve",
]

ENTRY_POINT_GROUP = "fedunlearn.plugins"

#: What a plugin may contribute by name, each looked up in the registry of that kind.
Kind = Literal["methods", "central_methods", "policies", "budget_schedules"]


@dataclass(frozen=True)
class Plugin:
    """What one package contributes, as lazy ``"module:attr"`` strings.

    Attributes:
        name: The plugin's name; equals its entry-point name.
        methods: Unlearning method name -> its ``Unlearner`` subclass
            (``fedunlearn.unlearn.registry.METHODS``).
        central_methods: Centralised method name -> its ``CentralUnlearner`` subclass
            (``fedunlearn.central.registry.METHODS``: sample unlearning on one recorded SGD
            run, e.g. Mini-Unlearning).
        policies: Recording policy name (``history.policy``) -> its ``PolicySpec``, which
            carries the options model of ``history.<name>`` (``fedunlearn.history.policy``).
        budget_schedules: DP budget schedule name (``privacy.budget.schedule``) -> its
            ``BudgetScheduleSpec`` (``fedunlearn.privacy.training``): a training hook.
        modules: Modules imported before any contribution is resolved (ones that register
            further pieces on import, e.g. a method's second backend).
        cli: ``"module:function"``; the function takes the root ``typer.Typer`` app and adds
            the plugin's commands to it.
    """

    name: str
    methods: Mapping[str, str] = field(default_factory=dict)
    central_methods: Mapping[str, str] = field(default_factory=dict)
    policies: Mapping[str, str] = field(default_factory=dict)
    budget_schedules: Mapping[str, str] = field(default_factory=dict)
    modules: tuple[str, ...] = ()
    cli: str | None = None

    def __post_init__(self) -> None:
        for kind in get_args(Kind):
            object.__setattr__(self, kind, MappingProxyType(dict(getattr(self, kind))))
        paths = [path for kind in get_args(Kind) for path in self.provides(kind).values()]
        for path in [*paths, *([self.cli] if self.cli else [])]:
            module, _, attr = path.partition(":")
            if not module or not attr:
                raise PluginError(f"plugin '{self.name}' names {path!r}; give a 'module:attr' path")

    def provides(self, kind: Kind) -> Mapping[str, str]:
        """Return the ``name -> "module:attr"`` contributions of one kind."""
        provided: Mapping[str, str] = getattr(self, kind)
        return provided


def resolve(path: str, what: str = "object") -> Any:
    """Import ``"module:attr"`` and return the attribute.

    Raises:
        PluginError: The module cannot be imported or has no such attribute (one line).
    """
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise PluginError(f"{what} {path!r} cannot be loaded: {type(err).__name__}: {err}") from err
    try:
        value: Any = module
        for part in attr.split("."):
            value = getattr(value, part)
    except AttributeError:
        raise PluginError(f"{what} {path!r}: module {module_name} has no '{attr}'") from None
    return value


def _load_entry(entry: EntryPoint) -> Plugin:
    where = f"entry point {ENTRY_POINT_GROUP}: {entry.name} = {entry.value}"
    try:
        plugin = entry.load()
    except (ImportError, AttributeError) as err:
        raise PluginError(f"plugin {where} cannot be loaded: {type(err).__name__}: {err}") from err
    if not isinstance(plugin, Plugin):
        raise PluginError(
            f"plugin {where} is a {type(plugin).__name__}; it must name a fedunlearn.plugins.Plugin"
        )
    if plugin.name != entry.name:
        raise PluginError(f"plugin {where} declares the name '{plugin.name}'; use one name")
    return plugin


@cache
def load(name: str) -> Plugin:
    """Return the declaration of the installed plugin ``name`` (its entry point's value).

    Raises:
        UnknownNameError: No plugin of that name is installed (lists those that are).
        PluginError: Its declaration cannot be loaded.
    """
    found = list(entry_points(group=ENTRY_POINT_GROUP, name=name))
    if not found:
        names = sorted({e.name for e in entry_points(group=ENTRY_POINT_GROUP)})
        raise UnknownNameError(f"unknown plugin '{name}'; installed: {', '.join(names)}")
    values = {e.value for e in found}
    if len(values) > 1:
        raise PluginError(
            f"plugin '{name}' is installed twice with different values: {', '.join(values)}"
        )
    return _load_entry(found[0])


@cache
def installed() -> Mapping[str, Plugin]:
    """Return every installed plugin's declaration, by name (declaration modules only)."""
    names = sorted({e.name for e in entry_points(group=ENTRY_POINT_GROUP)})
    return MappingProxyType({name: load(name) for name in names})


def declared(kind: Kind) -> set[str]:
    """Return the names of one kind that installed plugins declare."""
    return {name for plugin in installed().values() for name in plugin.provides(kind)}


@cache
def _activate(name: str) -> None:
    for module in load(name).modules:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise PluginError(
                f"module {module} of plugin '{name}' cannot be loaded: {type(err).__name__}: {err}"
            ) from err


def provider(kind: Kind, name: str) -> tuple[Plugin, str] | None:
    """Return the plugin providing ``name`` of ``kind`` and its path, with its modules imported.

    Only the declarations are read; the plugin's own ``modules`` are imported (once), the path
    is not (the caller resolves it). None if no installed plugin declares ``name``.

    Raises:
        PluginError: Two plugins declare ``name``, or a declaration cannot be loaded.
    """
    plugin: Plugin | None = None
    if any(True for _ in entry_points(group=ENTRY_POINT_GROUP, name=name)):
        own = load(name)  # the plugin named like what is looked up: one declaration read
        plugin = own if name in own.provides(kind) else None
    if plugin is None:
        providers = [p for p in installed().values() if name in p.provides(kind)]
        if len(providers) > 1:
            raise PluginError(
                f"'{name}' ({kind}) is declared by plugins "
                f"{', '.join(p.name for p in providers)}; uninstall one"
            )
        plugin = providers[0] if providers else None
    if plugin is None:
        return None
    _activate(plugin.name)
    return plugin, plugin.provides(kind)[name]


def cli_hooks() -> list[Callable[[Any], None]]:
    """Return every installed plugin's CLI hook (``cli``), resolved, in plugin-name order."""
    return [
        resolve(plugin.cli, f"CLI hook of plugin '{plugin.name}'")
        for plugin in installed().values()
        if plugin.cli is not None
    ]
