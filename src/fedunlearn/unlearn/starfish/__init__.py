"""Starfish: unlearning on history secret-shared between two non-colluding servers.

``params`` (the algorithm's ``StarfishParams`` and the run's ``StarfishExecution``),
``unlearner`` (the ``starfish`` method: Stage II, its details and runners), ``steps`` (TD,
SecRS, SecUE, SecTC), ``replay`` (the replay of the selected rounds), ``bound`` (Theorem 1),
``backend/`` (the arithmetic: ``protocol``, the ``plain`` mirror, ``mpc``) and ``deploy/``
(Stage I ``shares``, the two ``servers`` in threads, the ``clients`` service, the ``remote``
processes and their ``launcher``). Importing the package registers the method and both
runners (``deploy.servers`` registers ``mpc``).
Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal".
Design notes and every deviation: docs/methods/starfish.md; user guide: docs/starfish.md.
"""

from fedunlearn.unlearn.starfish.deploy import servers as _servers  # noqa: F401 (registration)
from fedunlearn.unlearn.starfish.params import StarfishExecution, StarfishParams
from fedunlearn.unlearn.starfish.unlearner import Starfish, StarfishDetails

__all__ = ["Starfish", "StarfishDetails", "StarfishExecution", "StarfishParams"]
