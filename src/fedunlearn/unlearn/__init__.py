"""Unlearning and recovery methods behind one interface, looked up by name.

One package per paper (``crab``, ``fedadp``, ``starfish``) and one module per baseline
(``baselines``), each an installed plugin (``fedunlearn.plugins``: its ``plugin`` module declares
what it contributes); this package names none of them. ``get_method``/``available_methods``
read the plugins' declarations and import a method's module on first lookup. Names are imported
on first use, so importing a plugin's declaration does not load the unlearning machinery. See
CONTRIBUTING.md ("Add a method").
"""

from __future__ import annotations

from fedunlearn.exports import by_module, lazy_exports

_EXPORTS = by_module(
    {
        "fedunlearn.unlearn.receipt": ("BoundReport", "Check", "Verification"),
        "fedunlearn.unlearn.base": (
            "Costs",
            "Details",
            "MethodParams",
            "NoDetails",
            "RunOutput",
            "UnlearnRequest",
            "UnlearnResult",
            "Unlearner",
        ),
        "fedunlearn.unlearn.views": ("EvaluationView", "RunView"),
        "fedunlearn.unlearn.context": ("UnlearnContext",),
        "fedunlearn.unlearn.session": ("UnlearnSession",),
        "fedunlearn.unlearn.registry": (
            "available_methods",
            "get_method",
            "make_method",
            "register",
        ),
    }
)

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
