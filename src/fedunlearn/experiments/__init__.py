"""Experiments: run methods on a run (or a centralised SGD run) and collect the judged results.

``compare`` (federated: ``compare_methods``, ``unlearn_one``) and ``central`` (Mini-Unlearning and
its baselines: ``run_central``). The documents they return are rendered by ``fedunlearn.report``.
"""

from fedunlearn.experiments.compare import RESULTS_SCHEMA_VERSION, compare_methods, unlearn_one

__all__ = ["RESULTS_SCHEMA_VERSION", "compare_methods", "unlearn_one"]
