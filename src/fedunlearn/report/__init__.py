"""Rendering of results documents: tables (results.csv/md), plots, the centralised tables.

The documents come from ``fedunlearn.experiments``; nothing here runs a method.
"""

from fedunlearn.report.plots import plot_results
from fedunlearn.report.tables import results_markdown, write_results

__all__ = ["plot_results", "results_markdown", "write_results"]
