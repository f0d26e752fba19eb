"""The ``central_baselines`` plugin's declaration: the centralised methods of §5.1 and references.

Entry point ``central_baselines`` of the group ``fedunlearn.plugins`` (pyproject.toml).
"""

from fedunlearn.plugins import Plugin

PLUGIN = Plugin(
    name="central_baselines",
    central_methods={
        "amnesiac": "fedunlearn.central.baselines.amnesiac:Amnesiac",
        "certified_removal": "fedunlearn.central.baselines.certified_removal:CertifiedRemoval",
        "deltagrad": "fedunlearn.central.baselines.deltagrad:DeltaGrad",
        "original": "fedunlearn.central.baselines.retrain:Original",
        "replay": "fedunlearn.central.baselines.retrain:ReplayRetrain",
        "retrain": "fedunlearn.central.baselines.retrain:FreshRetrain",
    },
)
