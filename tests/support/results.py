"""A result file as ``fedunlearn unlearn --out`` writes it, for tests of ``apply``."""

from __future__ import annotations

import json
from pathlib import Path

from fedunlearn.experiments import save_for_apply, unlearn_one


def saved_result(run: Path, tmp_path: Path, method: str, name: str, **params) -> Path:
    """Unlearn client 0 of ``run`` with ``method`` (no receipt) and write the result file."""
    result, summary = unlearn_one(run, [0], method, params=params or None, verify=False)
    path = tmp_path / f"{name}.json"
    save_for_apply(path, summary, result)
    path.write_text(json.dumps(summary))
    return path
