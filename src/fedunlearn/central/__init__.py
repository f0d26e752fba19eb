"""Centralised sample unlearning: Mini-Unlearning and its baselines on one recorded SGD run.

Train with ``train_sgd`` (a ``TrainingRecord``), then call
``make_method(name, params).unlearn(objective, record, forget)``. The core here (``base``,
``trainer``, ``objectives``, ``hvp``, ``recursion``, ``registry``) names no method: the methods
are plugins (``fedunlearn.plugins``, kind ``central_methods``), like the federated ones.
``mini_unlearning`` (plugin ``mini_unlearning``, package ``central.mini_unlearning``) and
``deltagrad``, ``certified_removal``, ``amnesiac`` and the reference rows ``original``,
``replay`` and ``retrain`` (plugin ``central_baselines``, package ``central.baselines``).
The package exports every name of its core modules' ``__all__``, imported on first use, so
reading a plugin declaration does not load torch.

Paper: Huang et al., "Machine Unlearning with Minimal Gradient Dependence for High Unlearning
Ratios" (Mini-Unlearning), §4, and the baselines it compares with in §5.1 (DeltaGrad, Certified
Data Removal, Amnesiac Unlearning, retraining).
Deviations: tagged per module; argued in docs/methods/mini_unlearning.md (MU) and
docs/methods/central_baselines.md (DG, CR, AM, RF).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

#: The core modules whose ``__all__`` this package re-exports (imported on first use).
_CORE = ("base", "hvp", "objectives", "recursion", "registry", "trainer")


def _core() -> list[ModuleType]:
    return [importlib.import_module(f"{__name__}.{module}") for module in _CORE]


def __getattr__(name: str) -> Any:
    """Return ``name`` from the core module whose ``__all__`` lists it (PEP 562).

    ``__all__`` itself is the union of the core modules' ``__all__``.
    """
    if name == "__all__":
        return sorted({n for module in _core() for n in module.__all__})
    for module in [] if name.startswith("__") else _core():  # introspection loads nothing
        if name in module.__all__:
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
