"""Crab: certified recovery from poisoning (selective storage, adaptive rollback, replay).

``params`` (recording options ``history.crab`` and method options), ``policy`` (the live
recording policy ``history.policy: crab``, registered on import), ``unlearner`` (the ``crab``
method), ``bound`` (Theorem 1). Paper: Jiang et al., arXiv:2401.08216v2. Design notes and every
deviation from the paper: docs/methods/crab.md.
"""

from fedunlearn.unlearn.crab.params import CrabParams, CrabSelectionConfig
from fedunlearn.unlearn.crab.policy import CrabPolicy, WindowSelector
from fedunlearn.unlearn.crab.unlearner import Crab

__all__ = ["Crab", "CrabParams", "CrabPolicy", "CrabSelectionConfig", "WindowSelector"]
