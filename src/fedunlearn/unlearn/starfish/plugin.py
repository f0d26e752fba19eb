"""The ``starfish`` plugin's declaration: the method and its CLI commands.

Entry point ``starfish`` of the group ``fedunlearn.plugins`` (pyproject.toml). The method's
``mpc`` runner (``deploy.servers``) is imported when a run first asks for that backend.
"""

from fedunlearn.plugins import Plugin

PLUGIN = Plugin(
    name="starfish",
    methods={"starfish": "fedunlearn.unlearn.starfish.unlearner:Starfish"},
    cli="fedunlearn.unlearn.starfish.cli:register",
)
