"""FedADP: unlearning with adaptive differential privacy and dual-layer selective storage.

``params`` (recording options ``history.fedadp`` and method options), ``policy`` (the live
recording policy ``history.policy: fedadp``), ``unlearner`` (the ``fedadp`` method), ``budget``
(the training hook ``privacy.budget.schedule: fedadp``, Eq. 4), ``plugin`` (the declaration of
what the package contributes: entry point ``fedadp``). Names are imported on first use, so
reading the declaration does not load the package. Paper: Jiang, Tong, Liu, Ye, Tan, Lam,
"Efficient Federated Unlearning with Adaptive Differential Privacy Preservation". Design notes
and every deviation: docs/methods/fedadp.md.
"""

from __future__ import annotations

from fedunlearn.exports import by_module, lazy_exports

_EXPORTS = by_module(
    {
        "fedunlearn.unlearn.fedadp.unlearner": ("FedADP",),
        "fedunlearn.unlearn.fedadp.params": ("FedADPParams", "FedADPSelectionConfig"),
        "fedunlearn.unlearn.fedadp.policy": ("FedADPPolicy", "StageSelector"),
    }
)

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
