"""Starfish: unlearning on history secret-shared between two non-colluding servers.

``params``, ``unlearner`` (the ``starfish`` method: Stage II), ``steps`` (TD, SecRS, SecUE,
SecTC), ``bound`` (Theorem 1), ``backend/`` (the arithmetic: plaintext mirror or 2PC) and
``deploy/`` (Stage I shares, the two servers, the clients service, the process launcher).
Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal".
Design notes and every deviation: docs/methods/starfish.md.
"""

from fedunlearn.unlearn.starfish.unlearner import Starfish, StarfishParams

__all__ = ["Starfish", "StarfishParams"]
