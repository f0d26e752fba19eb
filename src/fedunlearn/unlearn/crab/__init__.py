"""Crab: certified recovery from poisoning (selective storage, rollback, replay, final tuning).

``params`` (recording options ``history.crab`` and method options), ``policy`` (the live
recording policy ``history.policy: crab``), ``rollback`` (Stage II: the ``participation``,
``bounded`` and ``paper`` rules), ``unlearner`` (the ``crab`` method), ``bound`` (Theorem 1),
``plugin`` (the declaration of what the package contributes: entry point ``crab``). Names are
imported on first use, so reading the declaration does not load the package.
Paper: Jiang et al., arXiv:2401.08216v2. Design notes and every deviation from the paper:
docs/methods/crab.md.
"""

from __future__ import annotations

from fedunlearn.exports import by_module, lazy_exports

_EXPORTS = by_module(
    {
        "fedunlearn.unlearn.crab.unlearner": ("Crab", "CrabDetails"),
        "fedunlearn.unlearn.crab.params": ("CrabParams", "CrabSelectionConfig"),
        "fedunlearn.unlearn.crab.policy": ("CrabPolicy", "WindowSelector"),
    }
)

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
