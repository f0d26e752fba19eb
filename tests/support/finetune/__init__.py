"""Fine-tuning: continue FedAvg from the final model with the remaining clients for k rounds.

The worked example of CONTRIBUTING.md ("Add a method"): one package, one entry-point line, one
test file, one docs page. It is also a real (weak) baseline of the unlearning literature: it
dilutes the forgotten clients' influence but does not remove it, which the contract test and
the receipt make visible. Registered only inside the tests that use it
(``fedunlearn.unlearn.registry.registered("finetune", FineTune)``); a library method would be
declared in its package's ``plugin.py`` (``Plugin(methods={"finetune": "pkg.unlearner:FineTune"})``)
and named by one line of the entry-point group ``fedunlearn.plugins``.
"""

from tests.support.finetune.unlearner import FineTune, FineTuneDetails, FineTuneParams

__all__ = ["FineTune", "FineTuneDetails", "FineTuneParams"]
