"""Methods registered by name, so the CLI and benchmarks can list and select them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fedunlearn.errors import UnknownMethodError
from fedunlearn.unlearn.base import Unlearner

_METHODS: dict[str, type[Unlearner]] = {}
T = TypeVar("T", bound=type[Unlearner])


def register(name: str) -> Callable[[T], T]:
    """Class decorator: register an ``Unlearner`` under ``name`` (its registry key)."""

    def decorate(cls: T) -> T:
        if name in _METHODS and _METHODS[name] is not cls:
            raise ValueError(f"method name '{name}' is registered twice")
        cls.name = name
        _METHODS[name] = cls
        return cls

    return decorate


def available_methods() -> list[str]:
    """Return the registered method names, sorted."""
    return sorted(_METHODS)


def get_method(name: str) -> type[Unlearner]:
    """Return the class registered as ``name``."""
    if name not in _METHODS:
        raise UnknownMethodError(
            f"unknown unlearning method '{name}'; available: {', '.join(available_methods())}"
        )
    return _METHODS[name]


def make_method(name: str, params: dict[str, Any] | None = None) -> Unlearner:
    """Build the method ``name`` with hyperparameters ``params`` (validated)."""
    return get_method(name)(params)
