"""The ``deletion_ready`` plugin's declaration: exact unlearning of deletion-ready runs.

Entry point ``deletion_ready`` of the group ``fedunlearn.plugins`` (pyproject.toml).
"""

from fedunlearn.plugins import Plugin

PLUGIN = Plugin(
    name="deletion_ready",
    methods={
        "shard_retrain": "fedunlearn.unlearn.deletion_ready.tv_exact:ShardRetrain",
        "tv_exact": "fedunlearn.unlearn.deletion_ready.tv_exact:TvExact",
    },
)
