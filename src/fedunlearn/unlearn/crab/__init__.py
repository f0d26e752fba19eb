"""Crab: certified recovery from poisoning (selective storage, rollback, replay, final tuning).

``params`` (recording options ``history.crab`` and method options), ``policy`` (the live
recording policy ``history.policy: crab``, registered on import), ``rollback`` (Stage II: the
``participation``, ``bounded`` and ``paper`` rules), ``unlearner`` (the ``crab`` method),
``bound`` (Theorem 1). Paper: Jiang et al., arXiv:2401.08216v2. Design notes and every
deviation from the paper: docs/methods/crab.md.
"""

from fedunlearn.unlearn.crab.params import CrabParams, CrabSelectionConfig
from fedunlearn.unlearn.crab.policy import CrabPolicy, WindowSelector
from fedunlearn.unlearn.crab.unlearner import Crab, CrabDetails

__all__ = [
    "Crab",
    "CrabDetails",
    "CrabParams",
    "CrabPolicy",
    "CrabSelectionConfig",
    "WindowSelector",
]
