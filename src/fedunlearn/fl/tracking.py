"""Experiment tracking: a round observer that writes each round's metrics to TensorBoard.

``TensorBoardWriter(log_dir)`` is a ``RoundObserver``: after every round it writes the round's
numeric metrics (``test_accuracy``, ``test_loss``, ``train_loss``, ``backdoor_asr``, the DP
ledger's scalars, ...) plus ``num_accepted`` and ``num_rejected`` as scalars at step = round,
through ``torch.utils.tensorboard`` (which needs the ``tensorboard`` package:
``pip install "fedunlearn[tensorboard]"``). View them with ``tensorboard --logdir DIR``.
It flushes after every round, so a crashed run keeps what it wrote.

MLflow and other trackers plug in the same way: any object with ``on_round_end(record)``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fedunlearn.errors import ConfigError
from fedunlearn.fl.closing import Closing
from fedunlearn.fl.records import RoundRecord

__all__ = ["TensorBoardWriter"]


class TensorBoardWriter(Closing):
    """Write every round's numeric metrics as TensorBoard scalars (step = round).

    Use it as a context manager, or call ``close()``.

    Args:
        log_dir: Directory for the event files (created).
        prefix: Tag prefix, e.g. ``"train/"`` (tags are ``prefix + metric name``).

    Raises:
        ConfigError: if the ``tensorboard`` package is not installed.
    """

    def __init__(self, log_dir: str | Path, prefix: str = "") -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # torch.utils.tensorboard imports the tensorboard package
            raise ConfigError(
                "writing TensorBoard logs needs the tensorboard package, which is not "
                'installed; pip install "fedunlearn[tensorboard]" (or pip install tensorboard)'
            ) from None
        self.log_dir = Path(log_dir)
        self.prefix = prefix
        self._writer: Any = SummaryWriter(log_dir=str(self.log_dir))

    def on_round_end(self, record: RoundRecord) -> None:
        """Write the round's finite numeric metrics and its accepted/rejected counts."""
        scalars = {**record.metrics}
        scalars["num_accepted"] = len(record.updates)
        scalars["num_rejected"] = len(record.rejected)
        self.write(record.round, scalars)

    def write(self, step: int, scalars: dict[str, Any]) -> None:
        """Write the numeric, finite values of ``scalars`` at ``step`` and flush."""
        if self._writer is None:
            raise ConfigError(f"this TensorBoard writer ({self.log_dir}) is closed")
        for name, value in scalars.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if math.isfinite(value):
                self._writer.add_scalar(self.prefix + name, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file; calling it again does nothing."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
