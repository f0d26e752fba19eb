"""Run directories: build a federation from a config, train it with history recording, resume.

``setup`` (what a config determines: data, poisoning, model, federation), ``train`` (training
with recording and resume), ``rundir`` (the directory's files and ``run_info``).
"""

from fedunlearn.runs.rundir import (
    CONFIG_FILE,
    HISTORY_DIR,
    METRICS_FILE,
    PRIVACY_FILE,
    SUMMARY_FILE,
    MetricsWriter,
    load_run_config,
    metrics_line,
    run_info,
    run_privacy,
)
from fedunlearn.runs.setup import Setup, build_setup, clients_loss, reference_set
from fedunlearn.runs.train import attach_privacy, make_recording_policy, policy_env, train_run

__all__ = [
    "CONFIG_FILE",
    "HISTORY_DIR",
    "METRICS_FILE",
    "PRIVACY_FILE",
    "SUMMARY_FILE",
    "MetricsWriter",
    "Setup",
    "attach_privacy",
    "build_setup",
    "clients_loss",
    "load_run_config",
    "make_recording_policy",
    "metrics_line",
    "policy_env",
    "reference_set",
    "run_info",
    "run_privacy",
    "train_run",
]
