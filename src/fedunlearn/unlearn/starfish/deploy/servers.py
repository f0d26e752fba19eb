"""Running Starfish's two 2PC servers in one process: two threads, one client federation.

In-process (``StarfishExecution(backend="mpc")``, :func:`run_in_process`, registered as the
``mpc`` runner of :data:`~fedunlearn.unlearn.starfish.unlearner.RUNNERS`): the run's history is
secret-shared into two temporary share stores (:func:`~fedunlearn.unlearn.starfish.deploy.shares.
share_history`), then ``run_two_party`` runs the Starfish loop once per server, each thread on
its own ``MpcBackend`` and its own share store, over the in-process transport. Exact updates
come from the run's federation through one :class:`SharedClients` (a client trains once; both
servers receive their share of its upload). Party 0's model is returned after checking that
both servers opened the same model.

The process deployment (one process per server, the ``mpc`` dealer process, the client
simulator of :mod:`~fedunlearn.unlearn.starfish.deploy.clients`) is in
:mod:`fedunlearn.unlearn.starfish.deploy.remote`.

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Sec. III-A (two non-colluding servers), Alg. 4 (Stage I and II), App. B (2PC).
Deviations (docs/methods/starfish.md, SF24): the in-process simulation uses ``mpc.Dealer``
(both parties derive the material from one seed) and one client seed for both servers:
correct arithmetic, not a deployment.
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch

from fedunlearn.errors import SecureComputationError
from fedunlearn.fl.clients import ClientsWrapper, RunClients, TrainTask
from fedunlearn.fl.records import ClientUpdate
from fedunlearn.history.store import HistoryStore
from fedunlearn.mpc import FixedPoint, Party, run_two_party
from fedunlearn.unlearn.base import RunOutput, UnlearnRequest
from fedunlearn.unlearn.context import CostMeter, MeteredHistory, UnlearnContext
from fedunlearn.unlearn.starfish.backend.mpc import MpcBackend
from fedunlearn.unlearn.starfish.deploy.shares import (
    SharedStageOneRecord,
    share_history,
    share_settings,
)
from fedunlearn.unlearn.starfish.replay import LocalClients
from fedunlearn.unlearn.starfish.unlearner import ASSUMPTIONS, RUNNERS, Starfish, StarfishDetails

__all__ = ["SharedClients", "run_in_process"]


class SharedClients(ClientsWrapper):
    """The remaining clients, shared by both server threads: each upload is trained once.

    Both servers ask for the same exact updates in the same order at the same (public) model;
    the first request trains, the second receives the cached updates (the meter counts once).

    A ``fl.clients.ClientsWrapper`` over the run's remaining clients.

    Args:
        clients: The run's remaining clients (metered).
    """

    def __init__(self, clients: RunClients) -> None:
        super().__init__(clients)
        self._lock = threading.Lock()
        self._cache: dict[tuple[object, ...], list[ClientUpdate]] = {}

    def exclusive(self, evaluate: Callable[[torch.Tensor], dict] | None) -> Any:
        """Return ``evaluate`` run under the training lock (None stays None).

        The run's evaluation and its clients share one torch model: evaluation deep-copies
        it, and vectorised training wraps its tensors (``torch.func``) while it runs, so the
        two must never overlap (unguarded, party 0's evaluation failed in about 1 run of 3
        with "Cannot access storage of TensorWrapper" while party 1's thread trained).
        """
        if evaluate is None:
            return None

        def guarded(params: torch.Tensor) -> dict:
            with self._lock:
                return evaluate(params)

        return guarded

    def train(self, task: TrainTask) -> list[ClientUpdate]:
        """Return the clients' updates for ``task``; trained by the first caller."""
        params = task.global_params.detach().cpu().numpy().tobytes()
        key = (task.round, task.client_ids, task.spec, task.salt, hashlib.sha256(params).digest())
        with self._lock:
            if key in self._cache:
                return self._cache.pop(key)
            updates = self._wrapped.train(task)
            self._cache[key] = updates
            return updates


@RUNNERS.register("mpc")
def run_in_process(method: Starfish, request: UnlearnRequest, context: UnlearnContext) -> RunOutput:
    """Run Stage II as two 2PC servers in threads of this process; return party 0's result.

    Raises:
        SecureComputationError: If the two servers opened different models.
    """
    execution = method.execution
    lr = context.clients.spec.lr
    scale = method.scale(lr)
    seed = execution.mpc_seed
    client_seed = secrets.token_bytes(16) if seed is None else seed
    clients = SharedClients(context.clients)
    with tempfile.TemporaryDirectory(prefix="starfish-shares-") as tmp:
        dirs = [Path(tmp) / "server0", Path(tmp) / "server1"]
        share_history(context.history, dirs, lr=lr, seed=seed, **share_settings(method))

        def program(party: Party) -> RunOutput:
            k = party.party_id
            store = HistoryStore.open(dirs[k])
            try:
                meter = context.meter if k == 0 else CostMeter()
                # party 0's reads of the shares are its context's reads (the result's lineage)
                history = MeteredHistory(store, meter, context.read_log if k == 0 else None)
                own = dataclasses.replace(
                    context,
                    history=history,
                    clients=clients,
                    meter=meter,
                    evaluate=clients.exclusive(context.evaluate) if k == 0 else None,
                )
                backend = MpcBackend(
                    party,
                    client_seed=client_seed,
                    max_aggregate_norm=execution.norm_range[1],
                    norm_range=execution.norm_range,
                )
                record = SharedStageOneRecord(history, party)
                gateway = LocalClients(own, backend, scale, torch.float64)
                return method.replay(request, own, backend, record, gateway)
            finally:
                store.close()

        first, second = run_two_party(
            program,
            dealer_seed=secrets.token_bytes(16) if seed is None else seed,
            fixed_point=FixedPoint(execution.frac_bits),
            comparison=execution.comparison,
            local_seed=seed,
            timeout_seconds=execution.mpc_timeout_seconds,
        )
    if not torch.equal(first.params, second.params):
        raise SecureComputationError(
            "the two servers opened different unlearned models; the 2PC run is inconsistent"
        )
    # Starfish's replay returns its own details (StarfishDetails)
    first_details = cast(StarfishDetails, first.details)
    second_details = cast(StarfishDetails, second.details)
    details = dataclasses.replace(
        first_details,
        servers_opened_same_model=True,  # consistent openings, not a correct model (assumptions)
        mpc_costs_party1=second_details.mpc_costs or {},
        assumptions=(*first_details.assumptions, ASSUMPTIONS["in_process"]),
    )
    return dataclasses.replace(first, details=details)
