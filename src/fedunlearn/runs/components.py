"""User components of a run: resolve ``model.factory`` / ``data.source``, record and compare them.

A component is named in the config as ``"pkg.module:function"`` or by a name an installed
distribution registers under the entry-point group ``fedunlearn.models`` (model factories) or
``fedunlearn.datasets`` (data sources); ``load_component`` resolves either once, where the run
is assembled, and reports a bad name in one line (``fedunlearn.config`` stores the strings and
imports nothing). A component passed as a Python object (``train_run(..., model=make_net)``)
needs no resolving.

What a run records of each user component (``component_record``, kept in the history store's
metadata under ``components``): its import path, the distribution that provides its module and
that distribution's version (if any), and the SHA-256 of its source (the file of the module the
path names, plus the file of the module defining the object when that is another one); for data,
also the SHA-256 of the tensors themselves (``FederatedData.digest``). ``component_changes``
compares a recorded entry with the component in hand, so ``UnlearnSession`` (and through it
``unlearn``, ``audit``, ``compare``) and ``export`` warn in one line when a component changed
since training.
"""

from __future__ import annotations

import hashlib
import inspect
import sys
import warnings
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points, packages_distributions, version
from typing import Any

from fedunlearn.errors import ConfigError, FedUnlearnError
from fedunlearn.plugins import resolve

__all__ = [
    "COMPONENT_GROUPS",
    "component_changes",
    "component_record",
    "load_component",
    "warn_changed_components",
]

#: Entry-point group of each kind of component (``[project.entry-points."fedunlearn.models"]``).
COMPONENT_GROUPS = {"model.factory": "fedunlearn.models", "data.source": "fedunlearn.datasets"}


def load_component(path: str, what: str) -> Callable[..., Any]:
    """Return the callable ``path`` names: ``"pkg.module:function"`` or a registered name.

    Args:
        path: The config's string.
        what: The config key naming it (``"model.factory"`` or ``"data.source"``).

    Raises:
        ConfigError: The module cannot be imported (or raises while importing), has no such
            attribute, the name is not registered, or the object is not callable; one line.
    """
    if ":" not in path:
        group = COMPONENT_GROUPS.get(what, "fedunlearn.models")
        found = list(entry_points(group=group, name=path))
        if not found:
            names = sorted({e.name for e in entry_points(group=group)})
            raise ConfigError(
                f"{what} {path!r} is neither 'pkg.module:function' nor a name registered under "
                f"the entry-point group {group!r} (registered: {', '.join(names) or 'none'})"
            )
        path = found[0].value
    try:
        value = resolve(path, what)
    except FedUnlearnError as err:
        raise ConfigError(str(err)) from None
    except Exception as err:  # the user's module raised while being imported
        raise ConfigError(
            f"{what} {path!r}: importing its module raised {type(err).__name__}: {err}"
        ) from None
    if not callable(value):
        raise ConfigError(
            f"{what} {path!r} is a {type(value).__name__}, not a function; name a callable"
        )
    function: Callable[..., Any] = value
    return function


def object_path(obj: Any) -> str:
    """Return ``"module:qualname"`` of a function or class (``module:<type>`` otherwise)."""
    module = getattr(obj, "__module__", None) or type(obj).__module__
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return f"{module}:{name}"


def _source_file(module: Any) -> str | None:
    try:
        return inspect.getsourcefile(module)
    except TypeError:  # a built-in module
        return None


def _source_digest(obj: Any, path: str | None) -> tuple[str | None, str | None]:
    """Return (module name, SHA-256 of the source) of ``obj``.

    The source is the file of the module ``path`` names and, if ``obj`` is defined in another
    module (a factory re-exported from a package's ``__init__``), that module's file too.
    """
    modules = []
    if path and ":" in path:
        named = sys.modules.get(path.partition(":")[0])
        if named is not None:
            modules.append(named)
    defining = inspect.getmodule(obj)
    if defining is not None and defining not in modules:
        modules.append(defining)
    if not modules:
        return None, None
    h = hashlib.sha256()
    for module in modules:
        file = _source_file(module)
        if file is None:
            return modules[0].__name__, None
        try:
            with open(file, "rb") as fh:
                h.update(fh.read())
        except OSError:
            return modules[0].__name__, None
    return modules[0].__name__, h.hexdigest()


def component_record(obj: Any, path: str | None = None, **extra: Any) -> dict[str, Any]:
    """Return what a run records of one user component (JSON values).

    Args:
        obj: The resolved callable (or, for data passed as an object, the data's source if
            known, else None).
        path: The config's string (default: the object's ``module:qualname``).
        **extra: More facts to keep (``data_sha256``, ``input_shape``, ...).
    """
    record: dict[str, Any] = {"path": path or (object_path(obj) if obj is not None else None)}
    if obj is not None:
        module, digest = _source_digest(obj, record["path"])
        record["source_sha256"] = digest
        top = (module or "").split(".")[0]
        dists = packages_distributions().get(top, []) if top else []
        record["distribution"] = dists[0] if dists else None
        record["version"] = version(dists[0]) if dists else None
    record.update(extra)
    return record


_LABELS = {"model": "model.factory", "data": "data.source"}
_COMPARED = ("path", "version", "source_sha256", "data_sha256")


def component_changes(
    recorded: Mapping[str, Mapping[str, Any]], current: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Return one line per component whose record differs from the one in hand.

    Components recorded at training but absent now (or the reverse) count as changed, except
    where either side has no record at all (a run trained before components were recorded).
    """
    lines = []
    for key in sorted(set(recorded) | set(current)):
        old, new = recorded.get(key), current.get(key)
        if old is None or new is None:
            if old is not None or new is not None:
                was = (old or {}).get("path") or "built-in"
                now = (new or {}).get("path") or "built-in"
                lines.append(f"{key} was {was} at training, is {now} now")
            continue
        diffs = [f for f in _COMPARED if old.get(f) != new.get(f) and f in old and f in new]
        if diffs:
            what = ", ".join(
                "its source" if f == "source_sha256" else "its data" if f == "data_sha256" else f
                for f in diffs
            )
            path = new.get("path") or old.get("path")
            name = f"{_LABELS.get(key, key)} {path}" if path else f"the {key} passed in"
            lines.append(f"{name} changed since training ({what})")
    return lines


def warn_changed_components(
    recorded: Mapping[str, Mapping[str, Any]] | None,
    current: Mapping[str, Mapping[str, Any]],
    where: str,
) -> list[str]:
    """Warn (one line each) about components that changed since training; return the lines."""
    if recorded is None:
        return []
    lines = component_changes(recorded, current)
    for line in lines:
        warnings.warn(f"{where}: {line}; results may not match the trained run", stacklevel=3)
    return lines
