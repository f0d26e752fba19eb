"""The ``crab`` plugin's declaration: what the Crab package contributes (read without importing it).

Entry point ``crab`` of the group ``fedunlearn.plugins`` (pyproject.toml); ``fedunlearn.plugins``.
"""

from fedunlearn.plugins import Plugin

PLUGIN = Plugin(
    name="crab",
    methods={"crab": "fedunlearn.unlearn.crab.unlearner:Crab"},
    policies={"crab": "fedunlearn.unlearn.crab.policy:POLICY"},
)
