"""The clients of a run recorded from a user's Flower app, reached through the app's nodes.

``AppClients`` is the clients seam (``fedunlearn.fl.clients.RunClients``) over a Grid whose
SuperNodes run the user's ClientApp (fedunlearn's ``ClientApp``): ``train(task)`` finds the
node of each asked client (``app_nodes.NodeMap``: one ``query.fedunlearn`` to the nodes not
asked yet), sends each a plain ``train`` message (``"arrays"``: the start model in the run's keys
and shapes; ``"config"``: ``lr``, ``local-epochs``, ``batch-size``, ``fedunlearn.client-id``,
``fedunlearn.round``, ``fedunlearn.seed``, and ``local-steps`` for a deletion-ready run), checks
the replies as ``Recording`` does and returns the updates ``Δ_c = returned - start``. A client
with no node, an error reply or a rejected reply is left out and listed in ``missing[round]``
with the reason. Each exchange logs one progress line. ``client_losses`` asks a client's node
for its losses on its own data, unless its ClientApp said it computes none.
"""

from __future__ import annotations

import logging
import time
from logging import INFO
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common import log as flwr_log
from flwr.serverapp import Grid

from fedunlearn.errors import UnknownClientError
from fedunlearn.fl.clients import TrainTask
from fedunlearn.fl.records import ClientUpdate
from fedunlearn.fl.seeding import derive_seed
from fedunlearn.integrations.flower.app_nodes import NodeMap
from fedunlearn.integrations.flower.app_protocol import (
    CLIENT_ID,
    CONFIG_CLIENT,
    CONFIG_ROUND,
    CONFIG_SEED,
    LOCAL_STEPS,
    QUERY_TYPE,
    RECORD,
    ArrayLayout,
    Reply,
    check_reply,
)
from fedunlearn.integrations.flower.messages import array_record, error_text
from fedunlearn.unlearn.views import RunView

log = logging.getLogger(__name__)

NOT_PROVIDED = (
    "not provided: this client's ClientApp computes no losses (fedunlearn's ClientApp("
    "losses=...) would report its loss on its own data)"
)


class AppClients:
    """The recorded run's clients, reached through ``grid`` and the user's ClientApp.

    Args:
        grid: The ServerApp's Grid.
        run: The run, opened (``RunView``).
        layout: The run's array layout (keys and shapes of the ClientApp's arrays).
        weight_key: The sample-count key of a reply's metrics.
        round_timeout: Seconds to wait for one exchange's replies.
        node_timeout: Seconds to wait for a node per client to connect.
        label: The job, named in the progress lines.
    """

    def __init__(
        self,
        grid: Grid,
        run: RunView,
        layout: ArrayLayout,
        *,
        weight_key: str = "num-examples",
        round_timeout: float = 600.0,
        node_timeout: float = 60.0,
        label: str = "unlearning",
    ) -> None:
        self.grid = grid
        self.layout = layout
        self.spec = run.spec
        self.seed = run.config.seed
        self.model = run.model
        self.num_params = layout.size
        self.weight_key = weight_key
        self.round_timeout = round_timeout
        self.label = label
        self.nodes = NodeMap(grid, timeout=round_timeout, node_timeout=node_timeout)
        self._sizes = dict(run.client_sizes)
        self._run_rounds = run.num_rounds
        self.missing: dict[int, dict[int, str]] = {}

    @property
    def client_ids(self) -> tuple[int, ...]:
        """Every client of the run, sorted."""
        return tuple(sorted(self._sizes))

    def num_samples(self, client_id: int) -> int:
        """n_c as the client reported it during training."""
        if client_id not in self._sizes:
            raise UnknownClientError(f"client {client_id} is not in this run")
        return self._sizes[client_id]

    def node_of(self, client_id: int) -> int | None:
        """Return the node hosting ``client_id``, or None if none says so in time."""
        return self.nodes.node_of(client_id)

    def mark_missing(self, round_: int, client_id: int, reason: str) -> None:
        """Record that ``client_id`` did not contribute to ``round_``, and why."""
        log.warning("round %d: client %d is missing: %s", round_, client_id, reason)
        self.missing.setdefault(round_, {})[client_id] = reason

    def _message(self, task: TrainTask, cid: int, node: int, arrays: ArrayRecord) -> Message:
        spec = task.local_spec(self.spec)
        values: dict[str, Any] = {
            "lr": float(spec.lr),
            "local-epochs": int(spec.epochs),
            "batch-size": int(spec.batch_size),
            CONFIG_CLIENT: int(cid),
            CONFIG_ROUND: int(task.round),
            CONFIG_SEED: derive_seed(self.seed, "client", task.round, cid, task.salt),
        }
        if spec.steps is not None:
            values[LOCAL_STEPS] = int(spec.steps)
        return Message(
            RecordDict({"arrays": arrays, "config": ConfigRecord(values)}),
            dst_node_id=node,
            message_type="train",
            group_id=str(task.round),
        )

    def train(self, task: TrainTask) -> list[ClientUpdate]:
        """Ask ``task.client_ids`` to train from ``task.global_params`` (``Clients.train``)."""
        started = time.monotonic()
        arrays = self.layout.record(task.global_params)
        messages = []
        for asked in task.client_ids:
            node = self.node_of(asked)
            if node is None:
                self.mark_missing(task.round, asked, "no connected node hosts this client")
                continue
            messages.append(self._message(task, asked, node, arrays))
        got: dict[int, Reply] = {}
        for reply in self.grid.send_and_receive(messages, timeout=self.round_timeout):
            if reply.has_error():
                node = int(reply.metadata.src_node_id)
                for hosted in self.nodes.clients_of(node):
                    if hosted in task.client_ids:
                        why = error_text(reply, 200)
                        self.mark_missing(task.round, hosted, f"client error: ...{why}")
                continue
            cid, out = check_reply(reply, self.layout, weight_key=self.weight_key)
            if isinstance(out, str) or out.client_id not in task.client_ids:
                why = out if isinstance(out, str) else f"client {cid} was not asked"
                log.warning("round %d: rejected reply: %s", task.round, why)
                if cid is not None and cid in task.client_ids:
                    self.mark_missing(task.round, cid, f"rejected: {why}")
                continue
            got.setdefault(out.client_id, out)
        for asked in task.client_ids:
            if asked not in got and asked not in self.missing.get(task.round, {}):
                self.mark_missing(task.round, asked, f"no reply within {self.round_timeout:g} s")
        flwr_log(
            INFO,
            "fedunlearn: %s round %d (the run has %d): %d of %d client(s) trained (%.1f s)",
            self.label,
            task.round,
            self._run_rounds,
            len(got),
            len(task.client_ids),
            time.monotonic() - started,
        )
        start = task.global_params.detach().to(torch.float32).cpu()
        return [
            ClientUpdate(c, got[c].params - start, got[c].num_samples, got[c].loss or 0.0)
            for c in task.client_ids
            if c in got
        ]

    def client_losses(self, client_id: int, params: torch.Tensor) -> np.ndarray | str:
        """Return ``client_id``'s per-sample losses on its own data under ``params``, or why not."""
        node = self.node_of(client_id)
        if node is None:
            return "not shown: the forgotten client's data is on its node, and no node hosts it now"
        if not self.nodes.losses.get(client_id, True):
            return NOT_PROVIDED
        message = Message(
            RecordDict(
                {
                    "arrays": self.layout.record(params),
                    RECORD: ConfigRecord({"want": "losses", CLIENT_ID: int(client_id)}),
                }
            ),
            dst_node_id=node,
            message_type=QUERY_TYPE,
        )
        replies = list(self.grid.send_and_receive([message], timeout=self.round_timeout))
        if not replies:
            return "not shown: the forgotten client's data is on its node, which did not reply"
        if replies[0].has_error():
            why = error_text(replies[0], 200, last_line=True)
            return f"not shown: the forgotten client's data is on its node, which says: {why}"
        (values,) = array_record(replies[0].content["losses"]).to_numpy_ndarrays()
        return np.asarray(values, dtype=np.float64)

    def close(self) -> None:
        """Nothing to release (the Grid belongs to Flower)."""
