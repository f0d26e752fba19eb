"""Unlearning methods by name: ``register``, ``get_method``, ``make_method``, ``available_methods``.

One ``fedunlearn.registry.Registry``; the centralised methods (``fedunlearn.central``) use the same
type with the same three functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from fedunlearn.errors import UnknownMethodError
from fedunlearn.registry import Registry
from fedunlearn.unlearn.base import Unlearner

__all__ = ["METHODS", "available_methods", "get_method", "make_method", "register", "registered"]

METHODS: Registry[type[Unlearner]] = Registry("unlearning method", UnknownMethodError, plugins=True)
T = TypeVar("T", bound=type[Unlearner])


def register(name: str) -> Callable[[T], T]:
    """Class decorator: register an ``Unlearner`` under ``name`` (its registry key)."""

    def decorate(cls: T) -> T:
        METHODS.add(name, cls)
        cls.name = name
        return cls

    return decorate


@contextmanager
def registered(name: str, cls: T) -> Iterator[T]:
    """Register ``cls`` as ``name`` inside a ``with`` block only (a method under test)."""
    with METHODS.registered(name, cls):
        cls.name = name
        yield cls


def available_methods() -> list[str]:
    """Return the registered method names, sorted."""
    return METHODS.names()


def get_method(name: str) -> type[Unlearner]:
    """Return the class registered as ``name``."""
    return METHODS.get(name)


def make_method(name: str, params: Mapping[str, Any] | None = None) -> Unlearner:
    """Build the method ``name`` with hyperparameters ``params`` (validated)."""
    return get_method(name)(dict(params or {}))
