"""The ``starfish`` plugin's declaration: the method, its two-server runner and CLI commands.

Entry point ``starfish`` of the group ``fedunlearn.plugins`` (pyproject.toml). Loading the method
first imports ``deploy.servers``, which registers the ``mpc`` runner beside the ``plain`` one.
"""

from fedunlearn.plugins import Plugin

PLUGIN = Plugin(
    name="starfish",
    methods={"starfish": "fedunlearn.unlearn.starfish.unlearner:Starfish"},
    modules=("fedunlearn.unlearn.starfish.deploy.servers",),
    cli="fedunlearn.cli.starfish:register",
)
