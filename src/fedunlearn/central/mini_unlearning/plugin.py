"""The ``mini_unlearning`` plugin's declaration (read without importing the method).

Entry point ``mini_unlearning`` of the group ``fedunlearn.plugins`` (pyproject.toml);
``fedunlearn.plugins``.
"""

from fedunlearn.plugins import Plugin

PLUGIN = Plugin(
    name="mini_unlearning",
    central_methods={
        "mini_unlearning": "fedunlearn.central.mini_unlearning.unlearner:MiniUnlearning",
    },
)
