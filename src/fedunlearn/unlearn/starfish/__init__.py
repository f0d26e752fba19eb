"""Starfish: unlearning on history secret-shared between two non-colluding servers.

``params`` (the algorithm's ``StarfishParams`` and the run's ``StarfishExecution``),
``unlearner`` (the ``starfish`` method: Stage II, its details and runners), ``steps`` (TD,
SecRS, SecUE, SecTC), ``replay`` (the replay of the selected rounds), ``bound`` (Theorem 1),
``backend/`` (the arithmetic: ``protocol``, the ``plain`` mirror, ``mpc``), ``deploy/``
(Stage I ``shares``, the two ``servers`` in threads, the ``clients`` service, the ``remote``
processes and their ``launcher``) and ``plugin`` (the declaration: entry point ``starfish``).
Names are imported on first use and the ``mpc`` runner when a run first asks for it, so reading
the declaration loads neither the MPC nor the deployment code.
Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal".
Design notes and every deviation: docs/methods/starfish.md; user guide: docs/starfish.md.
"""

from __future__ import annotations

from fedunlearn.exports import by_module, lazy_exports

_EXPORTS = by_module(
    {
        "fedunlearn.unlearn.starfish.unlearner": ("Starfish", "StarfishDetails"),
        "fedunlearn.unlearn.starfish.params": ("StarfishExecution", "StarfishParams"),
    }
)

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
