"""What this distribution contributes to fedunlearn (entry point ``fedunlearn.plugins``)."""

from fedunlearn.plugins import Plugin

PLUGIN = Plugin(name="finetune", methods={"finetune": "fedunlearn_finetune.unlearner:FineTune"})
