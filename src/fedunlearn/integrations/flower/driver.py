"""The federation seen through a Flower ``Grid``: what the engine and unlearning methods ask.

``FlowerClients`` implements the clients seam ``fedunlearn.fl.clients.RunClients`` that the
training loop (``run_rounds``) and unlearning (``RemainingClients``, hence every method's fresh
client work) use, as the in-process ``Federation`` does. ``train`` sends one ``train`` message
to the SuperNode of each asked client only, waits for the replies (bounded by ``round_timeout``)
and returns the uploads in the order asked.

Steps of ``train``, in order:
1. ``messages``: if an asked client is not placed yet, wait (up to ``node_timeout``) for a
   SuperNode per client to connect and send the unplaced nodes a ``query`` (no model; node
   ids are random, the replies echo the client ids: ``messages.py``); then build one ``train``
   message per asked client with a node, with the seed ``derive_seed(seed, "client", round,
   client, salt)`` that ``Federation.train`` would use. Only asked clients get the model.
2. ``grid.send_and_receive``;
3. ``collect``: decode the replies, learn the node of each echoed client; a client with an
   error reply or with no upload before the timeout is recorded in ``missing[round]`` with
   the reason and left out; then the run's update mods (e.g. Crab's trim attacks, which need
   every upload) run on the server, as in-process.

The server knows every client's sample count from the run's setup, as in-process.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from flwr.app import Message
from flwr.serverapp import Grid

from fedunlearn.errors import UnknownClientError
from fedunlearn.fl.clients import TrainTask
from fedunlearn.fl.federation import Federation
from fedunlearn.fl.records import ClientUpdate
from fedunlearn.fl.seeding import derive_seed
from fedunlearn.integrations.flower.messages import (
    QUERY,
    TRAIN,
    FlowerProtocolError,
    echoed_client,
    error_text,
    query_content,
    read_update,
    train_content,
)

log = logging.getLogger(__name__)


def missing_json(missing: Mapping[int, Mapping[int, str]]) -> dict[str, dict[str, str]]:
    """Return ``FlowerClients.missing`` (round -> client id -> reason) with JSON keys, sorted."""
    return {
        str(r): {str(c): why for c, why in sorted(m.items())} for r, m in sorted(missing.items())
    }


def source_metadata(
    run_dir: Path, method: str, forget: Collection[int], kind: str, engine: str
) -> dict[str, str]:
    """Return the ``fedunlearn.source`` entry of an unlearned model file's metadata."""
    source = {
        "run": str(run_dir),
        "method": method,
        "forget": sorted(forget),
        "kind": kind,
        "engine": engine,
    }
    return {"fedunlearn.source": json.dumps(source, sort_keys=True)}


@dataclass
class WireStats:
    """Where a Flower round's time goes, as seen by the server."""

    messages: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    encode_seconds: float = 0.0
    exchange_seconds: float = 0.0  # send_and_receive: transport + client work + waiting
    exchanges: list[float] = field(default_factory=list)  # the same, one entry per exchange
    decode_seconds: float = 0.0
    discover_seconds: float = 0.0  # waiting for SuperNodes, asking which client each hosts


class FlowerClients:
    """A federation whose clients are Flower SuperNodes reached through ``grid``.

    Args:
        grid: The ServerApp's Grid.
        federation: The run's in-process federation, for its public pieces (model, local
            training spec, seed, client sizes) and its update mods; it never trains here.
        config_yaml: The run config as YAML, sent to the clients with each task.
        round_timeout: Seconds to wait for one round's replies.
        node_timeout: Seconds to wait for every client's SuperNode to connect.
    """

    def __init__(
        self,
        grid: Grid,
        federation: Federation,
        config_yaml: str,
        *,
        round_timeout: float = 600.0,
        node_timeout: float = 120.0,
    ) -> None:
        self.grid = grid
        self.model = federation.model
        self.spec = federation.spec
        self.seed = federation.seed
        self.malicious = federation.malicious
        self.update_mods = federation.update_mods
        self.num_params = federation.num_params
        self.config_yaml = config_yaml
        self.round_timeout = round_timeout
        self.node_timeout = node_timeout
        self._sizes = {c: federation.num_samples(c) for c in federation.client_ids}
        self._nodes: dict[int, int] = {}  # client id -> node id
        self.missing: dict[int, dict[int, str]] = {}  # round -> {client id: reason}
        self.stats = WireStats()

    @property
    def client_ids(self) -> tuple[int, ...]:
        """All client ids, sorted."""
        return tuple(sorted(self._sizes))

    def num_samples(self, client_id: int) -> int:
        """Return n_c, the size of a client's local training set."""
        self.check_clients([client_id])
        return self._sizes[client_id]

    def check_clients(self, client_ids: Sequence[int]) -> None:
        """Raise ``UnknownClientError`` unless every id belongs to this federation."""
        unknown = sorted(set(client_ids) - set(self._sizes))
        if unknown:
            raise UnknownClientError(
                f"client(s) {', '.join(map(str, unknown))} not in this federation "
                f"(client ids 0..{len(self._sizes) - 1})"
            )

    def wait_for_nodes(self) -> list[int]:
        """Return the connected node ids, first waiting up to ``node_timeout`` for one per client.

        Waits only while some client is unplaced; a shortfall is not an error (the clients
        without a node are recorded as missing).
        """
        started = time.perf_counter()
        deadline = time.monotonic() + self.node_timeout
        nodes = list(self.grid.get_node_ids())
        while len(self._nodes) < len(self._sizes) and len(nodes) < len(self._sizes):
            if time.monotonic() > deadline:
                log.warning(
                    "%d SuperNode(s) connected for %d clients after %g s; going on",
                    len(nodes),
                    len(self._sizes),
                    self.node_timeout,
                )
                break
            time.sleep(0.5)
            nodes = list(self.grid.get_node_ids())
        self.stats.discover_seconds += time.perf_counter() - started
        return nodes

    def place(self, client_ids: Sequence[int]) -> None:
        """Learn which node hosts each of ``client_ids`` not placed yet (``query`` messages)."""
        if all(c in self._nodes for c in client_ids):
            return
        placed = set(self._nodes.values())
        unplaced = [n for n in self.wait_for_nodes() if n not in placed]
        if not unplaced:
            return
        started = time.perf_counter()
        queries = [Message(query_content(), dst_node_id=n, message_type=QUERY) for n in unplaced]
        for reply in self.grid.send_and_receive(queries, timeout=self.round_timeout):
            if reply.has_error():
                log.warning(
                    "node %s did not say which client it hosts: %s",
                    reply.metadata.src_node_id,
                    error_text(reply, 300),
                )
                continue
            self._place(echoed_client(reply), reply.metadata.src_node_id)
        self.stats.discover_seconds += time.perf_counter() - started

    def _place(self, client_id: int, node: int) -> None:
        if self._nodes.setdefault(client_id, node) != node:
            raise FlowerProtocolError(
                f"nodes {self._nodes[client_id]} and {node} both host client {client_id}; give "
                "each SuperNode its own partition-id"
            )

    def messages(self, task: TrainTask) -> list[Message]:
        """Return the ``train`` messages asking ``task.client_ids`` to train in ``task.round``."""
        client_ids, round_, global_params = task.client_ids, task.round, task.global_params
        self.check_clients(client_ids)
        self.place(client_ids)
        started = time.perf_counter()
        out: list[Message] = []
        for cid in client_ids:
            if cid not in self._nodes:
                self.mark_missing(round_, cid, "no connected SuperNode hosts this client")
                continue
            content = train_content(
                global_params,
                [(cid, derive_seed(self.seed, "client", round_, cid, task.salt))],
                round_=round_,
                spec=task.local_spec(self.spec),
                run_config=self.config_yaml,
            )
            out.append(
                Message(
                    content, dst_node_id=self._nodes[cid], message_type=TRAIN, group_id=str(round_)
                )
            )
        self.stats.messages += len(out)
        self.stats.bytes_sent += len(out) * 4 * int(global_params.numel())
        self.stats.encode_seconds += time.perf_counter() - started
        return out

    def mark_missing(self, round_: int, client_id: int, reason: str) -> None:
        """Record that ``client_id`` did not contribute to ``round_``, and why."""
        log.warning("round %d: client %d is missing: %s", round_, client_id, reason)
        self.missing.setdefault(round_, {})[client_id] = reason

    def collect(self, replies: Iterable[Message], task: TrainTask) -> list[ClientUpdate]:
        """Decode replies to ``train`` messages; record non-repliers as missing; apply mods.

        Returns:
            The uploads of the clients that replied, in the order of ``task.client_ids``.
        """
        client_ids, round_ = task.client_ids, task.round
        started = time.perf_counter()
        got: dict[int, ClientUpdate] = {}
        for reply in replies:
            node = reply.metadata.src_node_id
            if reply.has_error():
                by_node = {n: c for c, n in self._nodes.items()}
                cid = by_node.get(node)
                if cid is not None and cid in client_ids:
                    # the end of the reason names the exception (Ray prefixes a traceback)
                    reason = error_text(reply, 300)
                    self.mark_missing(round_, cid, f"client error: ...{reason}")
                continue
            cid = echoed_client(reply)
            self._place(cid, node)
            update = read_update(reply)
            if update is not None:
                got[cid] = update
                self.stats.bytes_received += 4 * int(update.delta.numel())
        already = self.missing.get(round_, {})
        for cid in client_ids:
            if cid not in got and cid not in already:
                self.mark_missing(round_, cid, f"no reply within {self.round_timeout:g} s")
        updates = [got[c] for c in client_ids if c in got]
        for mod in self.update_mods:
            updates = mod(round_, task.global_params, updates)
        self.stats.decode_seconds += time.perf_counter() - started
        return updates

    def train(self, task: TrainTask) -> list[ClientUpdate]:
        """Train over Flower (``fl.clients.Clients.train``); the missing: ``missing[round]``."""
        msgs = self.messages(task)
        exchange = time.perf_counter()
        replies = list(self.grid.send_and_receive(msgs, timeout=self.round_timeout))
        self.stats.exchanges.append(time.perf_counter() - exchange)
        self.stats.exchange_seconds += self.stats.exchanges[-1]
        return self.collect(replies, task)

    def close(self) -> None:
        """Nothing to release (the Grid belongs to Flower)."""
