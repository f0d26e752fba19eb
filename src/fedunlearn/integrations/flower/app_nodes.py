"""Which node hosts which client of a user's Flower app, learned by asking the nodes once.

Flower's node ids are random (new ones each simulation run); the app's clients are the stable
ids of the node configs (``app_protocol``). ``NodeMap`` asks each connected node it has not
asked yet (one ``query.fedunlearn`` message, ``want = "client-ids"``) which clients it hosts and
whether its ClientApp computes losses, and remembers the answers for the job: training with
deletion-ready sampling draws among the clients of the connected nodes, unlearning sends each
client's work to its node.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedunlearn.integrations.flower.app_protocol import QUERY_TYPE, RECORD
from fedunlearn.integrations.flower.messages import error_text

log = logging.getLogger(__name__)


class NodeMap:
    """The app's clients and the nodes hosting them, for one job.

    Args:
        grid: The ServerApp's Grid.
        timeout: Seconds to wait for one exchange's replies.
        node_timeout: Seconds to wait for a node to connect when a client is not placed yet.
    """

    def __init__(self, grid: Grid, *, timeout: float = 600.0, node_timeout: float = 60.0) -> None:
        self.grid = grid
        self.timeout = timeout
        self.node_timeout = node_timeout
        self.nodes: dict[int, int] = {}  # client id -> node id
        self.losses: dict[int, bool] = {}  # client id -> its node computes losses
        self._asked: set[int] = set()

    def refresh(self) -> None:
        """Ask the connected nodes not asked yet which clients they host."""
        fresh = sorted(set(self.grid.get_node_ids()) - self._asked)
        if fresh:
            self._ask(fresh)

    def wait_for(self, count: int) -> None:
        """Wait up to ``node_timeout`` for ``count`` nodes to connect, then ask them."""
        deadline = time.monotonic() + self.node_timeout
        while len(list(self.grid.get_node_ids())) < count and time.monotonic() < deadline:
            time.sleep(0.5)
        self.refresh()

    def present(self) -> list[int]:
        """Return the clients of the nodes connected now, sorted (asking new nodes first)."""
        self.refresh()
        connected = set(self.grid.get_node_ids())
        return sorted(c for c, n in self.nodes.items() if n in connected)

    def node_of(self, client_id: int) -> int | None:
        """Return the node hosting ``client_id``, or None if none says so within ``node_timeout``.

        While ``client_id`` is unplaced, newly connected nodes are asked until the timeout.
        """
        deadline = time.monotonic() + self.node_timeout
        while client_id not in self.nodes:
            fresh = sorted(set(self.grid.get_node_ids()) - self._asked)
            if fresh:
                self._ask(fresh)
            elif time.monotonic() > deadline:
                return None
            else:
                time.sleep(0.5)
        return self.nodes[client_id]

    def clients_of(self, node: int) -> list[int]:
        """Return the clients ``node`` said it hosts."""
        return sorted(c for c, n in self.nodes.items() if n == node)

    def _ask(self, nodes: Sequence[int]) -> None:
        self._asked |= set(nodes)
        query = [
            Message(
                RecordDict({RECORD: ConfigRecord({"want": "client-ids"})}),
                dst_node_id=n,
                message_type=QUERY_TYPE,
            )
            for n in nodes
        ]
        for reply in self.grid.send_and_receive(query, timeout=self.timeout):
            node = int(reply.metadata.src_node_id)
            if reply.has_error():
                log.warning(
                    "node %d did not say which clients it hosts (is its ClientApp fedunlearn's "
                    "ClientApp?): %s",
                    node,
                    error_text(reply, 200, last_line=True),
                )
                continue
            answer = reply.content[RECORD]
            computes = bool(answer.get("losses", True))  # type: ignore[union-attr]
            for cid in answer["client-ids"]:  # type: ignore[index, union-attr]
                self.nodes.setdefault(int(cid), node)
                self.losses.setdefault(int(cid), computes)
