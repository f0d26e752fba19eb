"""Centralised methods by name: ``register``, ``get_method``, ``available_methods``.

Paper: none (plumbing). Deviations: none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedunlearn.central.base import CentralUnlearner
from fedunlearn.errors import UnknownMethodError

__all__ = ["METHODS", "available_methods", "get_method", "register"]

METHODS: dict[str, type[CentralUnlearner]] = {}


def register(name: str) -> Callable[[type[CentralUnlearner]], type[CentralUnlearner]]:
    """Register a ``CentralUnlearner`` subclass under ``name`` (one word, as its module)."""

    def decorate(cls: type[CentralUnlearner]) -> type[CentralUnlearner]:
        if name in METHODS:
            raise ValueError(f"central method '{name}' is already registered")
        cls.name = name
        METHODS[name] = cls
        return cls

    return decorate


def available_methods() -> list[str]:
    """Return the registered names, sorted."""
    return sorted(METHODS)


def get_method(name: str, **params: Any) -> CentralUnlearner:
    """Build the method ``name`` with the given hyper-parameters.

    Raises:
        UnknownMethodError: if ``name`` is not registered.
        ConfigError: on invalid hyper-parameters.
    """
    if name not in METHODS:
        raise UnknownMethodError(
            f"unknown central method '{name}'; available: {', '.join(available_methods())}"
        )
    return METHODS[name](**params)
