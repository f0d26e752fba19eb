"""Comparisons of unlearning methods on one run: results.json/csv/md and plots."""

from fedunlearn.report.compare import RESULTS_SCHEMA_VERSION, compare_methods, unlearn_one
from fedunlearn.report.plots import plot_results
from fedunlearn.report.tables import results_markdown, write_results

__all__ = [
    "RESULTS_SCHEMA_VERSION",
    "compare_methods",
    "plot_results",
    "results_markdown",
    "unlearn_one",
    "write_results",
]
