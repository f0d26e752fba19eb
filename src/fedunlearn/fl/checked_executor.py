"""``CheckedExecutor``: an executor's ``run`` that checks its inputs before it trains.

The vectorized and the pool executor (``fl/vectorized.py``, ``fl/pool.py``) refuse the same bad
inputs with the same errors, here: global parameters that are not a flat vector of the model's
size, and tasks naming a client they hold no data for. A subclass sets the model's size and its
clients' sizes, and trains in ``_train``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.records import ClientUpdate, check_task_clients
from fedunlearn.models.flat import check_flat

__all__ = ["CheckedExecutor"]


class CheckedExecutor:
    """An executor (``fl.executors.Executor``) whose ``run`` checks its inputs, then trains.

    Attributes:
        name: The executor's kind.
        _num_params: d, the model's number of parameters (set by the subclass).
        _sizes: Client id -> its number of samples, for every client held (set by the subclass).
    """

    name: str
    _num_params: int
    _sizes: Mapping[int, int]

    def run(
        self,
        global_params: torch.Tensor,
        tasks: Sequence[tuple[int, int]],
        spec: LocalTrainingSpec,
    ) -> list[ClientUpdate]:
        """Train every ``(client_id, seed)`` task from ``global_params``; updates in task order.

        Raises:
            ConfigError: if ``global_params`` is not a flat vector of this model's size.
            UnknownClientError: if a task names a client this executor has no data for.
            FedUnlearnError: if the executor cannot run (the pool: closed, or a worker died;
                the pool is closed after a crash).
        """
        self._check_ready()
        check_flat(global_params, self._num_params)
        check_task_clients(tasks, self._sizes)
        return self._train(global_params, tasks, spec)

    def _check_ready(self) -> None:
        """Raise ``FedUnlearnError`` if this executor cannot run (by default it always can)."""

    def _train(
        self, global_params: torch.Tensor, tasks: Sequence[tuple[int, int]], spec: LocalTrainingSpec
    ) -> list[ClientUpdate]:
        """Train the checked tasks; one update per task, in task order."""
        raise NotImplementedError
