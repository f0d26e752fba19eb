"""The clients seam: what a server may ask of its clients, wherever they run.

``Clients`` is the one protocol behind every place that asks clients for local work: the
in-process ``Federation``, Flower's ``FlowerClients`` (SuperNodes reached through a Grid),
unlearning's ``RemainingClients`` (the federation without the forgotten clients, metered) and a
Starfish server's ``PublicClients`` (ids, sizes and the run seed; it refuses to train and holds
no model). ``RunClients`` adds what the training loop and unlearning methods read besides: the
run seed (client sampling, fresh seeds) and the model template; an unlearning context's clients
are ``RunClients``.

A training request is one frozen value, ``TrainTask``, documented here once; every
implementation's ``train(task)`` reads it. Seeds: client ``c`` of round ``r`` trains with
``derive_seed(seed, "client", r, c, salt)``, so ``salt=0`` reproduces the original run's batch
order whoever asks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Protocol

import torch
from torch import nn

from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.records import ClientUpdate

__all__ = ["Clients", "ClientsWrapper", "RunClients", "TrainTask"]


@dataclass(frozen=True)
class TrainTask:
    """One request for local training: who trains, from which model, in which round.

    Attributes:
        global_params: Flat global model M_t the clients start from.
        client_ids: Clients to ask, in the order results are wanted (any sequence of ids;
            stored as a tuple of ``int``).
        round: Round number (1-based); part of each client's seed.
        spec: Local training override (e.g. fewer calibration epochs); None: the clients'
            ``spec``.
        salt: Extra seed key, so that a method's fresh training can differ from the original
            run's (0 reproduces the original run's batch order).
    """

    global_params: torch.Tensor
    client_ids: Sequence[int]
    round: int
    _: KW_ONLY
    spec: LocalTrainingSpec | None = None
    salt: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "client_ids", tuple(int(c) for c in self.client_ids))

    def local_spec(self, default: LocalTrainingSpec) -> LocalTrainingSpec:
        """Return the local training spec to use: this task's override, else ``default``."""
        return default if self.spec is None else self.spec


class Clients(Protocol):
    """Clients a server can address: who they are, their sizes, how they train."""

    @property
    def client_ids(self) -> tuple[int, ...]:
        """Ids of the clients that may be asked to train, sorted."""
        ...

    @property
    def spec(self) -> LocalTrainingSpec:
        """The run's local training hyperparameters (the default of a ``TrainTask``)."""
        ...

    @property
    def num_params(self) -> int:
        """Model size d (the length of an update)."""
        ...

    def num_samples(self, client_id: int) -> int:
        """Return n_c, the size of a client's local training set (public: FedAvg weights)."""
        ...

    def train(self, task: TrainTask) -> list[ClientUpdate]:
        """Ask ``task.client_ids`` to train from ``task.global_params``; return their uploads.

        Returns:
            The uploads, in the order of ``task.client_ids`` (an implementation that can lose
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


class ClientsWrapper:
    """``RunClients`` that pass every member on to other ``RunClients``; override what differs.

    The wrapper form of changing how clients answer (as Flower's DP strategies wrap a
    ``Strategy``): unlearning's ``RemainingClients`` (fewer clients, metered), Starfish's
    in-process ``SharedClients`` (one training for two servers), the client membership test's
    salted clients, the Flower strategy's already-delivered uploads. The wrapped clients are
    private (``_wrapped``), not part of the interface a method is given.

    Args:
        clients: The clients wrapped.
    """

    def __init__(self, clients: RunClients) -> None:
        self._wrapped = clients

    @property
    def client_ids(self) -> tuple[int, ...]:
        """The wrapped clients' ids."""
        return self._wrapped.client_ids

    @property
    def spec(self) -> LocalTrainingSpec:
        """The wrapped clients' local training hyperparameters."""
        return self._wrapped.spec

    @property
    def num_params(self) -> int:
        """Model size d."""
        return self._wrapped.num_params

    @property
    def seed(self) -> int:
        """The run seed."""
        return self._wrapped.seed

    @property
    def model(self) -> nn.Module:
        """The model template."""
        return self._wrapped.model

    def num_samples(self, client_id: int) -> int:
        """n_c of a client."""
        return self._wrapped.num_samples(client_id)

    def train(self, task: TrainTask) -> list[ClientUpdate]:
        """Ask the wrapped clients (``Clients.train``)."""
        return self._wrapped.train(task)
