"""Lazy package exports: a package names its public objects and imports each on first use.

A package's ``__init__`` lists ``name -> module`` (or ``module -> names``, through
``by_module``) and sets ``__getattr__ =
lazy_exports(__name__, EXPORTS)``, so importing the package (e.g. to read a plugin declaration
inside it, or ``fedunlearn`` itself) imports none of the modules behind its names (PEP 562).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["by_module", "lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """Return a module ``__getattr__`` that imports ``exports[name]`` and returns its ``name``."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


def by_module(groups: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """Return ``name -> module`` from ``module -> names`` (an ``EXPORTS`` table, grouped)."""
    return {name: module for module, names in groups.items() for name in names}
