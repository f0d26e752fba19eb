"""Unlearning and recovery methods behind one interface, registered by name.

One package per paper (``crab``, ``fedadp``, ``starfish``) and one module per baseline
(``baselines``); importing this package registers every method and the recording policies the
method packages define. See ``available_methods()`` and CONTRIBUTING.md ("Add a method").
"""

from fedunlearn.unlearn import baselines, crab, fedadp, starfish  # noqa: F401  (registration)
from fedunlearn.unlearn.base import (
    Costs,
    Details,
    MethodParams,
    NoDetails,
    RunOutput,
    Unlearner,
    UnlearnRequest,
    UnlearnResult,
)
from fedunlearn.unlearn.context import UnlearnContext
from fedunlearn.unlearn.registry import available_methods, get_method, make_method, register
from fedunlearn.unlearn.session import UnlearnSession

__all__ = [
    "Costs",
    "Details",
    "MethodParams",
    "NoDetails",
    "RunOutput",
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
