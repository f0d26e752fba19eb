"""FedADP: unlearning with adaptive differential privacy and dual-layer selective storage.

``params`` (recording options ``history.fedadp`` and method options), ``policy`` (the live
recording policy ``history.policy: fedadp``, registered on import), ``unlearner`` (the ``fedadp``
method). Paper: Jiang, Tong, Liu, Ye, Tan, Lam, "Efficient Federated Unlearning with Adaptive
Differential Privacy Preservation". Design notes and every deviation: docs/methods/fedadp.md.
"""

from fedunlearn.unlearn.fedadp.params import FedADPParams, FedADPSelectionConfig
from fedunlearn.unlearn.fedadp.policy import FedADPPolicy, StageSelector
from fedunlearn.unlearn.fedadp.unlearner import FedADP

__all__ = ["FedADP", "FedADPParams", "FedADPPolicy", "FedADPSelectionConfig", "StageSelector"]
