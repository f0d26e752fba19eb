"""Unlearning methods by name: ``register``, ``get_method``, ``make_method``, ``available_methods``.

One ``fedunlearn.registry.ClassRegistry`` (the centralised methods of ``fedunlearn.central`` use
the same type). Besides the classes registered here, it serves the ``methods`` that installed
plugins declare (``fedunlearn.plugins``): a name is looked up in the plugins' declarations and
only the module defining it is imported.
"""

from __future__ import annotations

from fedunlearn.errors import UnknownMethodError
from fedunlearn.registry import ClassRegistry
from fedunlearn.unlearn.base import Unlearner

__all__ = ["METHODS", "available_methods", "get_method", "make_method", "register", "registered"]

METHODS: ClassRegistry[type[Unlearner]] = ClassRegistry(
    "unlearning method", UnknownMethodError, plugin_kind="methods"
)

#: Class decorator: register an ``Unlearner`` under ``name`` (its registry key).
register = METHODS.register
#: Register a class as ``name`` inside a ``with`` block only (a method under test).
registered = METHODS.registered
#: Return the method names (registered and declared by installed plugins), sorted.
available_methods = METHODS.names
#: Return the class registered as ``name`` (raises ``UnknownMethodError`` listing the names).
get_method = METHODS.get
#: Build the method ``name`` with hyperparameters ``params`` (validated).
make_method = METHODS.make
