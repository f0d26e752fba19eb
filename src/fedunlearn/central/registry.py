"""Centralised methods by name: ``register``, ``get_method``, ``make_method``, ``available_*``.

The same ``fedunlearn.registry.ClassRegistry`` type and names as ``fedunlearn.unlearn.registry``
(no plugin kind: the centralised methods are the modules of ``fedunlearn.central``).
"""

from __future__ import annotations

from fedunlearn.central.base import CentralUnlearner
from fedunlearn.errors import UnknownMethodError
from fedunlearn.registry import ClassRegistry

__all__ = ["METHODS", "available_methods", "get_method", "make_method", "register"]

METHODS: ClassRegistry[type[CentralUnlearner]] = ClassRegistry("central method", UnknownMethodError)

#: Class decorator: register a ``CentralUnlearner`` under ``name`` (one word, as its module).
register = METHODS.register
#: Return the registered names, sorted.
available_methods = METHODS.names
#: Return the class registered as ``name`` (raises ``UnknownMethodError`` listing the names).
get_method = METHODS.get
#: Build the method ``name`` with hyperparameters ``params`` (raises ``ConfigError`` if invalid).
make_method = METHODS.make
