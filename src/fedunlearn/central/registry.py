"""Centralised methods by name: ``register``, ``get_method``, ``make_method``, ``available_*``.

The same ``fedunlearn.registry.Registry`` type and functions as ``fedunlearn.unlearn.registry``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from fedunlearn.central.base import CentralUnlearner
from fedunlearn.errors import UnknownMethodError
from fedunlearn.registry import Registry

__all__ = ["METHODS", "available_methods", "get_method", "make_method", "register"]

METHODS: Registry[type[CentralUnlearner]] = Registry("central method", UnknownMethodError)
T = TypeVar("T", bound=type[CentralUnlearner])


def register(name: str) -> Callable[[T], T]:
    """Class decorator: register a ``CentralUnlearner`` under ``name`` (one word, as its module)."""

    def decorate(cls: T) -> T:
        METHODS.add(name, cls)
        cls.name = name
        return cls

    return decorate


def available_methods() -> list[str]:
    """Return the registered names, sorted."""
    return METHODS.names()


def get_method(name: str) -> type[CentralUnlearner]:
    """Return the class registered as ``name``.

    Raises:
        UnknownMethodError: if ``name`` is not registered.
    """
    return METHODS.get(name)


def make_method(name: str, params: Mapping[str, Any] | None = None) -> CentralUnlearner:
    """Build the method ``name`` with hyperparameters ``params``.

    Raises:
        UnknownMethodError: if ``name`` is not registered.
        ConfigError: on invalid hyperparameters.
    """
    return get_method(name)(dict(params or {}))
