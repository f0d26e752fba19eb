"""Write an unlearning result so that ``fedunlearn apply`` can make it the run's model.

``save_for_apply(out_json, summary, result)`` writes ``<out stem>.apply.safetensors`` beside the
result JSON (the model and, where the method returned one, its trajectory:
``fedunlearn.history.result_file``) and names it in ``summary["apply"]`` with the file's and the
model's SHA-256; ``summary["run"]`` (``UnlearnSession.identity``) names the run state the result
was computed on. Last it seals the summary (``summary["integrity"]``: a SHA-256 over its whole
content, bound to ``summary["run"]``, ``fedunlearn.history.digest``), so write the summary
unchanged after this call. ``fedunlearn.runs.apply_result(run_dir, out_json)`` checks the seal,
both digests and the run state, and applies it. The whole lifecycle: docs/lifecycle.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedunlearn.history.digest import seal
from fedunlearn.history.result_file import tensor_sha256, write_result_file
from fedunlearn.runs.rundir import write_text_atomic
from fedunlearn.unlearn import UnlearnResult

__all__ = ["apply_file_path", "save_for_apply", "write_result"]


def apply_file_path(out_json: str | Path) -> Path:
    """Return the apply file written beside ``out_json`` (``R.json`` -> ``R.apply.safetensors``)."""
    out_json = Path(out_json)
    return out_json.with_name(out_json.stem + ".apply.safetensors")


def save_for_apply(
    out_json: str | Path,
    summary: dict[str, Any],
    result: UnlearnResult,
    *,
    apply_file: bool = True,
) -> dict[str, Any]:
    """Write the apply file of ``result`` beside ``out_json``; add ``summary["apply"]``; seal it.

    The seal (``summary["integrity"]``) covers the whole summary as it is now, bound to
    ``summary["run"]``: anything changed in it afterwards makes ``apply`` and ``audit --result``
    refuse the file. ``apply_file`` False writes no file (``unlearn --no-apply-file``): ``file``
    and ``sha256`` are None and ``fedunlearn apply`` refuses the result.

    Returns:
        ``{"file", "sha256", "model_sha256", "trajectory_rounds", "estimated_updates"}``
        (``trajectory_rounds`` None when the method returned no trajectory).
    """
    path = apply_file_path(out_json)
    trajectory = result.trajectory
    digest = write_result_file(path, result.params, trajectory) if apply_file else None
    spec = {
        "file": path.name if apply_file else None,
        "sha256": digest,
        "model_sha256": tensor_sha256(result.params),
        "trajectory_rounds": None if trajectory is None else trajectory.length,
        "estimated_updates": None if trajectory is None else trajectory.estimated_updates(),
    }
    summary["apply"] = spec
    seal(summary, summary.get("run"))
    return spec


def write_result(
    out_json: str | Path, summary: dict[str, Any], result: UnlearnResult, *, apply_file: bool = True
) -> dict[str, Any]:
    """Write what ``fedunlearn unlearn --out`` writes: the apply file, then the sealed JSON.

    Both atomically (a temporary file renamed into place): a crash or a full disk leaves no part
    of either, and if the JSON cannot be written the apply file is removed again (a copy of the
    history nobody names).

    ``apply_file`` False: the JSON only (``save_for_apply``).

    Returns:
        ``summary["apply"]`` (``save_for_apply``).

    Raises:
        OSError: A file cannot be written (e.g. no space left); neither is left behind.
    """
    out_json = Path(out_json)
    spec = save_for_apply(out_json, summary, result, apply_file=apply_file)
    try:
        write_text_atomic(out_json, json.dumps(summary, indent=2) + "\n")
    except BaseException:
        apply_file_path(out_json).unlink(missing_ok=True)
        raise
    return spec
