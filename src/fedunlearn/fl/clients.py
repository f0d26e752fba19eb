"""The clients seam: what a server may ask of its clients, wherever they run.

``Clients`` is the one protocol behind every place that asks clients for local work: the
in-process ``Federation``, Flower's ``FlowerClients`` (SuperNodes reached through a Grid),
unlearning's ``RemainingClients`` (the federation without the forgotten clients, metered) and a
Starfish server's ``PublicClients`` (ids and sizes only; it refuses to train). ``RunClients``
adds what the training loop and ``RemainingClients`` read besides: the run seed (client sampling,
fresh seeds) and the model template.

``train`` is defined here once. Seeds: client ``c`` of round ``r`` trains with
``derive_seed(seed, "client", r, c, salt)``, so ``salt=0`` reproduces the original run's batch
order whoever asks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import nn

from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.records import ClientUpdate

__all__ = ["Clients", "RunClients"]


class Clients(Protocol):
    """Clients a server can address: who they are, their sizes, how they train."""

    @property
    def client_ids(self) -> tuple[int, ...]:
        """Ids of the clients that may be asked to train, sorted."""
        ...

    @property
    def spec(self) -> LocalTrainingSpec:
        """The run's local training hyperparameters (the default of ``train``)."""
        ...

    @property
    def num_params(self) -> int:
        """Model size d (the length of an update)."""
        ...

    def num_samples(self, client_id: int) -> int:
        """Return n_c, the size of a client's local training set (public: FedAvg weights)."""
        ...

    def train(
        self,
        global_params: torch.Tensor,
        client_ids: Sequence[int],
        round_: int,
        *,
        spec: LocalTrainingSpec | None = None,
        salt: int = 0,
    ) -> list[ClientUpdate]:
        """Ask ``client_ids`` to train from ``global_params`` and return their uploads.

        Args:
            global_params: Flat global model M_t.
            client_ids: Clients to ask, in the order results are wanted.
            round_: Round number (1-based); part of each client's seed.
            spec: Local training override (e.g. fewer calibration epochs); default ``spec``.
            salt: Extra seed key, so that a method's fresh training can differ from the
                original run's (0 reproduces the original run's batch order).

        Returns:
            The uploads, in the order of ``client_ids`` (an implementation that can lose
            clients, e.g. over a network, leaves the missing ones out and says where).
        """
        ...


class RunClients(Clients, Protocol):
    """A run's clients as the training loop sees them: ``Clients`` plus seed and model."""

    @property
    def seed(self) -> int:
        """The run seed (client sampling and client seeds derive from it)."""
        ...

    @property
    def model(self) -> nn.Module:
        """The model template (its structure; its parameters are not used)."""
        ...
