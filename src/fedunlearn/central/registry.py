"""Centralised methods by name: ``register``, ``get_method``, ``make_method``, ``available_*``.

The same ``fedunlearn.registry.ClassRegistry`` type and names as ``fedunlearn.unlearn.registry``.
Besides the classes registered here, it serves the ``central_methods`` that installed plugins
declare (``fedunlearn.plugins``): Mini-Unlearning (plugin ``mini_unlearning``), the baselines it
is compared with (plugin ``central_baselines``) and any third-party package's. A name is looked
up in the declarations and only the module defining it is imported; this module, like the rest
of the centralised core (``base``, ``trainer``, ``objectives``, ``hvp``, ``recursion``), names
no method package (an import-linter contract keeps it so).
"""

from __future__ import annotations

from fedunlearn.central.base import CentralUnlearner
from fedunlearn.errors import UnknownMethodError
from fedunlearn.registry import ClassRegistry

__all__ = ["METHODS", "available_methods", "get_method", "make_method", "register", "registered"]

METHODS: ClassRegistry[type[CentralUnlearner]] = ClassRegistry(
    "central method", UnknownMethodError, plugin_kind="central_methods"
)

#: Class decorator: register a ``CentralUnlearner`` under ``name`` (one word, as its module).
register = METHODS.register
#: Register a class as ``name`` inside a ``with`` block only (a method under test).
registered = METHODS.registered
#: Return the method names (registered and declared by installed plugins), sorted.
available_methods = METHODS.names
#: Return the class registered as ``name`` (raises ``UnknownMethodError`` listing the names).
get_method = METHODS.get
#: Build the method ``name`` with hyperparameters ``params`` (raises ``ConfigError`` if invalid).
make_method = METHODS.make
