"""The test tree itself: pytest's default import mode needs every test file name to be unique."""

from __future__ import annotations

from collections import Counter
from pathlib import Path


def test_test_file_basenames_are_unique() -> None:
    root = Path(__file__).parent
    names = Counter(path.name for path in root.rglob("test_*.py"))
    duplicated = sorted(name for name, count in names.items() if count > 1)
    assert not duplicated, f"rename these test files (pytest cannot collect both): {duplicated}"
