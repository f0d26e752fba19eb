"""The ``baselines`` plugin's declaration: the methods the papers are judged against.

Entry point ``baselines`` of the group ``fedunlearn.plugins`` (pyproject.toml).
"""

from fedunlearn.plugins import Plugin

PLUGIN = Plugin(
    name="baselines",
    methods={
        "federaser": "fedunlearn.unlearn.baselines.federaser:FedEraser",
        "fedrecover": "fedunlearn.unlearn.baselines.fedrecover:FedRecover",
        "none": "fedunlearn.unlearn.baselines.none:NoUnlearning",
        "random": "fedunlearn.unlearn.baselines.random:RandomRounds",
        "retrain": "fedunlearn.unlearn.baselines.retrain:Retrain",
    },
)
