"""Experiments: run methods on a run (or a centralised SGD run) and collect the judged results.

``compare`` (federated: ``compare_methods``, ``unlearn_one``; every result verified, its receipt
attached), ``audit`` (the receipt of any model of a run's architecture: ``audit_model``) and
``central`` (Mini-Unlearning and its baselines: ``run_central``) and ``lifecycle`` (a result's
apply file: ``save_for_apply``). The documents they return are
rendered by ``fedunlearn.report``.
"""

from fedunlearn.experiments.audit import audit_model, read_model_file
from fedunlearn.experiments.compare import (
    RESULTS_SCHEMA_VERSION,
    Progress,
    compare_methods,
    unlearn_one,
)
from fedunlearn.experiments.lifecycle import apply_file_path, save_for_apply, write_result

__all__ = [
    "RESULTS_SCHEMA_VERSION",
    "Progress",
    "apply_file_path",
    "audit_model",
    "compare_methods",
    "read_model_file",
    "save_for_apply",
    "write_result",
    "unlearn_one",
]
