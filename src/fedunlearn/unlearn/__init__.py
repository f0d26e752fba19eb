"""Unlearning and recovery methods behind one interface, registered by name.

Importing this package registers every method module; see ``registry.available_methods()``.
"""

from fedunlearn.unlearn import (  # noqa: F401
    crab,
    fedadp,
    federaser,
    fedrecover,
    original,
    random_rounds,
    retrain,
    starfish,
)
from fedunlearn.unlearn.base import (
    Costs,
    MethodParams,
    UnlearnContext,
    Unlearner,
    UnlearnRequest,
    UnlearnResult,
)
from fedunlearn.unlearn.registry import available_methods, get_method, make_method, register
from fedunlearn.unlearn.session import UnlearnSession

__all__ = [
    "Costs",
    "MethodParams",
    "UnlearnContext",
    "UnlearnRequest",
    "UnlearnResult",
    "UnlearnSession",
    "Unlearner",
    "available_methods",
    "get_method",
    "make_method",
    "register",
]
