"""Fine-tuning: continue FedAvg from the final model with the remaining clients for k rounds.

The worked example of fedunlearn's CONTRIBUTING.md ("Add a method"), as a third-party
distribution: one package, one entry-point line (``pyproject.toml``), one test file
(``tests/test_contract.py``, which runs ``fedunlearn.testing``'s contract checks). It is also a
real (weak) baseline of the unlearning literature: it dilutes the forgotten clients' influence
but does not remove it, which its lineage (``approximate``) and the receipt make visible.

This ``__init__`` stays light: fedunlearn imports the package to read ``plugin.PLUGIN`` when it
lists the methods, and imports ``unlearner`` only when ``finetune`` is used.
"""
