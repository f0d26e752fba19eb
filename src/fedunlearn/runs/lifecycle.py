"""A living run's commands, kept importable under their first home (older imports).

The lifecycle lives in modules of one job each: ``fedunlearn.runs.apply`` (apply a result or a
model), ``fedunlearn.runs.continuation`` (``--continue``), ``fedunlearn.runs.dp_gate`` (the DP
gate and ledger entry of an apply), ``fedunlearn.runs.run_files`` (the files derived from the
store) and ``fedunlearn.runs.fingerprint`` (the digests naming a run's state). The rounds a
continuation trains are assembled as training's are (``fedunlearn.runs.rounds``).
"""

from fedunlearn.runs.apply import apply_model, apply_result
from fedunlearn.runs.continuation import (
    BUDGET_RESTART_KEY,
    ClientsFactory,
    continue_run,
    continue_target,
)
from fedunlearn.runs.fingerprint import receipt_sha256, run_fingerprint
from fedunlearn.runs.rounds import RecorderFactory
from fedunlearn.runs.run_files import rebuild_run_files

__all__ = [
    "BUDGET_RESTART_KEY",
    "ClientsFactory",
    "RecorderFactory",
    "apply_model",
    "apply_result",
    "continue_run",
    "continue_target",
    "rebuild_run_files",
    "receipt_sha256",
    "run_fingerprint",
]
