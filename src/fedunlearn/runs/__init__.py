"""Run directories: build a federation from a config, train it with history recording, resume.

``assembly`` (``resolve_config``: the policy, its options and the budget schedule a config
names, looked up in the plugins and checked together), ``setup`` (what a config determines:
data (``setup_data``), poisoning, model, federation), ``rounds`` (the recorded rounds: the one
assembly training, resume and ``--continue`` share), ``train`` (training with recording, resume
and repair), ``rundir`` (the directory's files, ``run_info`` and ``check_run``), ``forget``
(erasing clients' stored updates and the evidence of it), ``apply`` (applying an unlearning
result, gated on a DP run by ``dp_gate``), ``continuation`` (training on with ``--continue``),
``run_files`` (the files derived from the store) and ``fingerprint`` (what names a run's
state); ``lifecycle`` re-exports the living run's commands for older imports.
"""

from fedunlearn.runs.apply import apply_model, apply_result
from fedunlearn.runs.assembly import resolve_config
from fedunlearn.runs.continuation import continue_run, continue_target
from fedunlearn.runs.fingerprint import receipt_sha256, run_fingerprint
from fedunlearn.runs.forget import deletion_evidence, forget_clients
from fedunlearn.runs.rounds import make_recording_policy, policy_env
from fedunlearn.runs.run_files import rebuild_run_files
from fedunlearn.runs.rundir import (
    CONFIG_FILE,
    HISTORY_DIR,
    METRICS_FILE,
    PRIVACY_FILE,
    SUMMARY_FILE,
    MetricsWriter,
    check_run,
    holds_run,
    load_run_config,
    metrics_line,
    restore_config,
    run_info,
    run_privacy,
    stored_metrics_line,
    write_text_atomic,
)
from fedunlearn.runs.setup import Setup, build_setup, clients_loss, reference_set
from fedunlearn.runs.train import train_run, wrap_privacy

__all__ = [
    "CONFIG_FILE",
    "HISTORY_DIR",
    "METRICS_FILE",
    "PRIVACY_FILE",
    "SUMMARY_FILE",
    "MetricsWriter",
    "Setup",
    "wrap_privacy",
    "apply_model",
    "apply_result",
    "build_setup",
    "check_run",
    "clients_loss",
    "continue_run",
    "continue_target",
    "deletion_evidence",
    "forget_clients",
    "holds_run",
    "load_run_config",
    "make_recording_policy",
    "metrics_line",
    "policy_env",
    "rebuild_run_files",
    "receipt_sha256",
    "reference_set",
    "resolve_config",
    "restore_config",
    "run_fingerprint",
    "run_info",
    "run_privacy",
    "stored_metrics_line",
    "train_run",
    "write_text_atomic",
]
