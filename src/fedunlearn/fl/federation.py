"""The federation: every client's data and local training, behind one call.

``Federation`` is the in-process implementation of the clients seam (``fl.clients.Clients``):
``train(TrainTask(global_params, client_ids, round))`` is how the training loop *and* every
unlearning method ask clients for fresh local work. It derives each client's seed from (run
seed, round, client, salt), runs the chosen executor (or the ``local_training`` given, e.g.
``fedunlearn.privacy``'s DP-SGD), and then the update mods (attacks, client-update DP) in order.
``with_local_training`` returns the same clients training another way (a wrapper; this
federation is left as it is). Malicious clients stay malicious whoever asks them to train;
before the attack's start round they train on their clean data (``honest_data``), whoever asks.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

import torch
from torch import nn

from fedunlearn.errors import UnknownClientError
from fedunlearn.fl import executors
from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.clients import TrainTask
from fedunlearn.fl.closing import Closing
from fedunlearn.fl.executors import Executor
from fedunlearn.fl.records import ClientData, ClientUpdate
from fedunlearn.fl.seeding import derive_seed
from fedunlearn.models.flat import num_params

UpdateMod = Callable[[int, torch.Tensor, Sequence[ClientUpdate]], list[ClientUpdate]]


class LocalTraining(Protocol):
    """Local training swapped in for the executor's ``local_update`` (e.g. DP-SGD)."""

    name: str

    def run(
        self,
        global_params: torch.Tensor,
        tasks: Sequence[tuple[int, int]],
        spec: LocalTrainingSpec,
        round_: int,
    ) -> list[ClientUpdate]:
        """Return one update per ``(client_id, seed)`` task, in task order."""
        ...

    def close(self) -> None:
        """Release threads or workers, if any."""
        ...


class Federation(Closing):
    """Clients' data, the model template and the local training they run when asked.

    Args:
        model: Template module (its parameters are not used; only its structure).
        client_data: Local training set of every client, keyed by client id.
        spec: Default local training hyperparameters.
        seed: Run seed; client batch orders derive from it.
        malicious: Ids of the attacking clients (informational; attacks act through the data
            they hold and the update mods).
        update_mods: Functions ``(round, global_params, updates) -> updates`` applied in order.
        honest_data: Clean data of data-poisoning attackers, trained on before
            ``attack_start_round`` (they behave honestly until then).
        attack_start_round: First round in which ``honest_data``'s clients use their poisoned
            data.
        executor: ``auto``, ``serial``, ``vectorized`` or ``pool``.
        num_workers: Worker processes for the pool executor.
        device: Where local training runs (``auto``, ``cpu``, ``cuda[:i]``, ``mps``; see
            ``fl.device``); resolved here (``executors.executor_device``), so ``self.device``
            is the ``torch.device`` clients train on.
        local_training: Replaces the executor's local training when set (it gets the round).
    """

    def __init__(
        self,
        model: nn.Module,
        client_data: Mapping[int, ClientData],
        spec: LocalTrainingSpec,
        *,
        seed: int,
        malicious: frozenset[int] = frozenset(),
        update_mods: Sequence[UpdateMod] = (),
        honest_data: Mapping[int, ClientData] | None = None,
        attack_start_round: int = 1,
        executor: str = "auto",
        num_workers: int | None = None,
        device: str | torch.device = "cpu",
        local_training: LocalTraining | None = None,
    ) -> None:
        self.model = model
        self.device = executors.executor_device(executor, device)
        self.client_data = dict(client_data)
        self.spec = spec
        self.seed = seed
        self.malicious = frozenset(malicious)
        self.update_mods = tuple(update_mods)
        self.honest_data = dict(honest_data or {}) if attack_start_round > 1 else {}
        self.attack_start_round = attack_start_round
        self.num_params = num_params(model)
        self._executor_kind = executor
        self._num_workers = num_workers
        self._executor: Executor | None = None
        self._started = False
        self.local_training = local_training

    @property
    def client_ids(self) -> tuple[int, ...]:
        """All client ids, sorted."""
        return tuple(sorted(self.client_data))

    @property
    def training_data(self) -> dict[int, ClientData]:
        """Client id -> data local training reads; an honest attacker's clean copy is -1 - id."""
        return {**self.client_data, **{-1 - c: d for c, d in self.honest_data.items()}}

    @property
    def executor(self) -> Executor:
        """The executor, started on first use."""
        if self._executor is None:
            self._executor = executors.make_executor(
                self.model, self.training_data, self._executor_kind, self._num_workers, self.device
            )
        return self._executor

    def start(self) -> None:
        """Build the executor now rather than on first use, and call its ``start``.

        A one-time setup cost (stacking the clients' data, starting workers,
        ``executors.preload_lazy_imports``) that is then not charged to whatever trains first.
        """
        if self._started:
            return
        start = getattr(self.executor, "start", None)  # an executor may have none
        if start is not None:
            start()
        self._started = True

    def num_samples(self, client_id: int) -> int:
        """Return n_c, the size of a client's local training set."""
        self.check_clients([client_id])
        return len(self.client_data[client_id])

    def check_clients(self, client_ids: Sequence[int]) -> None:
        """Raise ``UnknownClientError`` unless every id belongs to this federation."""
        unknown = sorted(set(client_ids) - set(self.client_data))
        if unknown:
            ids = self.client_ids
            known = f"{ids[0]}..{ids[-1]}" if ids == tuple(range(ids[0], ids[-1] + 1)) else ids
            raise UnknownClientError(
                f"client(s) {', '.join(map(str, unknown))} not in this federation "
                f"(client ids {known})"
            )

    def train(self, task: TrainTask) -> list[ClientUpdate]:
        """Return the (modded) uploads of ``task.client_ids`` (``fl.clients.Clients.train``)."""
        client_ids, round_ = task.client_ids, task.round
        self.check_clients(client_ids)
        honest = round_ < self.attack_start_round
        tasks = [
            (
                -1 - cid if honest and cid in self.honest_data else cid,
                derive_seed(self.seed, "client", round_, cid, task.salt),
            )
            for cid in client_ids
        ]
        spec = task.local_spec(self.spec)
        if self.local_training is not None:
            updates = self.local_training.run(task.global_params, tasks, spec, round_)
        else:
            updates = self.executor.run(task.global_params, tasks, spec)
        updates = [
            u if u.client_id == cid else replace(u, client_id=cid)
            for u, cid in zip(updates, client_ids, strict=True)
        ]
        for mod in self.update_mods:
            updates = mod(round_, task.global_params, updates)
        return updates

    def with_local_training(self, local_training: LocalTraining) -> Federation:
        """Return these clients training with ``local_training``; this federation is unchanged.

        Same data, seeds, attackers and update mods; only how a client trains differs (e.g.
        fresh unlearning updates clipped like a DP-SGD run's training, or DP-SGD itself). The
        two share no executor; closing the returned one closes ``local_training``.
        """
        return self._derived(local_training=local_training, update_mods=self.update_mods)

    def with_update_mod(self, mod: UpdateMod) -> Federation:
        """Return these clients with ``mod`` applied after the existing update mods.

        The wrapper form of adding a mod (e.g. the clip-and-noise DP mechanism for training);
        this federation is unchanged and the two share no executor.
        """
        return self._derived(
            local_training=self.local_training, update_mods=(*self.update_mods, mod)
        )

    def without_samples(self, samples: Mapping[int, Collection[int]]) -> Federation:
        """Return these clients with the listed samples deleted from their data (by stable id).

        A sample-level deletion: the clients keep the other samples' ids, so deletion-consistent
        mini-batches (``fl.sampling.step_batches``) draw what they drew before wherever a deleted
        sample was not drawn. This federation is unchanged; the two share no executor.

        Raises:
            UnknownClientError: a listed client is not in this federation.
        """
        self.check_clients(list(samples))
        data, honest = dict(self.client_data), dict(self.honest_data)
        for client, ids in samples.items():
            data[client] = data[client].without(ids)
            if client in honest:
                honest[client] = honest[client].without(ids)
        return self._derived(
            local_training=self.local_training,
            update_mods=self.update_mods,
            client_data=data,
            honest_data=honest,
        )

    def _derived(
        self,
        *,
        local_training: LocalTraining | None,
        update_mods: Sequence[UpdateMod],
        client_data: Mapping[int, ClientData] | None = None,
        honest_data: Mapping[int, ClientData] | None = None,
    ) -> Federation:
        return Federation(
            self.model,
            self.client_data if client_data is None else client_data,
            self.spec,
            seed=self.seed,
            malicious=self.malicious,
            update_mods=update_mods,
            honest_data=self.honest_data if honest_data is None else honest_data,
            attack_start_round=self.attack_start_round,
            executor=self._executor_kind,
            num_workers=self._num_workers,
            device=self.device,
            local_training=local_training,
        )

    def close(self) -> None:
        """Stop worker processes (the executor's and the local training's), if any."""
        if self._executor is not None:
            self._executor.close()
            self._executor = None
            self._started = False
        if self.local_training is not None:
            self.local_training.close()
