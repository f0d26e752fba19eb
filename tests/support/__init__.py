"""Helpers shared by several test packages (import as ``tests.support``)."""

from __future__ import annotations

from fedunlearn.testing import run_dir_digest as digest

__all__ = ["digest"]
