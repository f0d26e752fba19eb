"""Experiments: run methods on a run (or a centralised SGD run) and collect the judged results.

``compare`` (federated: ``compare_methods``, ``unlearn_one``; every result verified, its receipt
attached), ``audit`` (the receipt of any model of a run's architecture: ``audit_model``) and
``central`` (Mini-Unlearning and its baselines: ``run_central``). The documents they return are
rendered by ``fedunlearn.report``.
"""

from fedunlearn.experiments.audit import audit_model, read_model_file
from fedunlearn.experiments.compare import (
    RESULTS_SCHEMA_VERSION,
    Progress,
    compare_methods,
    unlearn_one,
)

__all__ = [
    "RESULTS_SCHEMA_VERSION",
    "Progress",
    "audit_model",
    "compare_methods",
    "read_model_file",
    "unlearn_one",
]
