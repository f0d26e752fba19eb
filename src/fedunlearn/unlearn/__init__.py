"""Unlearning and recovery methods behind one interface, looked up by name.

One package per paper (``crab``, ``fedadp``, ``starfish``) and one module per baseline
(``baselines``), each an installed plugin (``fedunlearn.plugins``: its ``plugin`` module declares
what it contributes); this package names none of them. ``get_method``/``available_methods``
read the plugins' declarations and import a method's module on first lookup. Names are imported
on first use, so importing a plugin's declaration does not load the unlearning machinery. See
CONTRIBUTING.md ("Add a method").
"""

from __future__ import annotations

from fedunlearn.exports import lazy_exports

_EXPORTS = {
    "BoundReport": "fedunlearn.unlearn.receipt",
    "Check": "fedunlearn.unlearn.receipt",
    "Costs": "fedunlearn.unlearn.base",
    "Details": "fedunlearn.unlearn.base",
    "EvaluationView": "fedunlearn.unlearn.views",
    "MethodParams": "fedunlearn.unlearn.base",
    "NoDetails": "fedunlearn.unlearn.base",
    "RunOutput": "fedunlearn.unlearn.base",
    "RunView": "fedunlearn.unlearn.views",
    "UnlearnContext": "fedunlearn.unlearn.context",
    "UnlearnRequest": "fedunlearn.unlearn.base",
    "UnlearnResult": "fedunlearn.unlearn.base",
    "UnlearnSession": "fedunlearn.unlearn.session",
    "Unlearner": "fedunlearn.unlearn.base",
    "Verification": "fedunlearn.unlearn.receipt",
    "available_methods": "fedunlearn.unlearn.registry",
    "get_method": "fedunlearn.unlearn.registry",
    "make_method": "fedunlearn.unlearn.registry",
    "register": "fedunlearn.unlearn.registry",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
