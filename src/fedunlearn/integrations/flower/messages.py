"""What fedunlearn's server and clients say to each other over Flower, and how it is encoded.

Two message types (Flower's message types):

- ``query``: no model; a node replies with the fedunlearn client it hosts (its
  ``partition-id``). The server asks this of nodes it has not placed yet (usually once per
  job): Flower's node ids are random, and a model must reach only the clients asked to train.
- ``train``: the global model (``ArrayRecord`` ``"global"``, one flat float32 array) and the
  task (``ConfigRecord`` ``"task"``: round, the local training hyperparameters (``steps``:
  TV-stable training's local mini-batch steps, 0 for epochs), the run config
  as YAML, and parallel lists ``client-ids`` / ``seeds``, one entry: the node's client). The
  node replies with its delta (``ArrayRecord`` ``"delta"``) and ``MetricRecord`` ``"metrics"``
  (``num-samples``, ``train-loss``); a node whose client is not listed replies idle (no delta).

Every reply echoes the client id in ``ConfigRecord`` ``"client"``. Each seed is derived by the
server exactly as ``Federation.train`` derives it (``derive_seed(seed, "client", round, client,
salt)``), so a client trains on the batches it would have used in-process. float32 arrays cross
the wire unchanged (bit-exact).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedunlearn.errors import FedUnlearnError
from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.records import ClientUpdate

QUERY = "query"
TRAIN = "train"


class FlowerProtocolError(FedUnlearnError, ValueError):
    """A Flower message does not hold what fedunlearn's protocol needs."""


@dataclass(frozen=True)
class TrainTask:
    """One client's training request, as decoded from a ``train`` message."""

    seeds: dict[int, int]  # client id -> seed of its batch order
    round: int
    spec: LocalTrainingSpec
    run_config: str  # the run's RunConfig as YAML (dump_config)
    global_params: torch.Tensor


def error_text(reply: Message, limit: int = 300, *, last_line: bool = False) -> str:
    """A reply's error reason for a log or a record: its end (Ray prefixes a traceback).

    Flower types the reason ``str | None``; a missing or blank one reads "no reason given"
    (it used to raise AttributeError or IndexError while the round's other replies waited).
    """
    reason = (reply.error.reason or "").strip()
    if last_line and reason:
        reason = reason.splitlines()[-1]
    return reason[-limit:] or "no reason given"


def _array(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to(torch.float32).cpu().contiguous().numpy()


def wire_values(record: ArrayRecord | ConfigRecord | MetricRecord) -> Mapping[str, Any]:
    """A config or metric record as the wire values it holds (int()/float() check each read)."""
    return cast(Mapping[str, Any], record)


def array_record(record: ArrayRecord | ConfigRecord | MetricRecord) -> ArrayRecord:
    """A record this protocol sends as arrays (a peer's other kind fails where it is read)."""
    return cast(ArrayRecord, record)


def _tensor(record: ArrayRecord) -> torch.Tensor:
    (array,) = record.to_numpy_ndarrays()
    return torch.from_numpy(np.array(array, dtype=np.float32, copy=True))


def query_content() -> RecordDict:
    """Return the content of a ``query`` message (no model: only the node's client id is asked)."""
    return RecordDict({"query": ConfigRecord({"want": "client-id"})})


def client_echo(client_id: int) -> ConfigRecord:
    """Return the ``ConfigRecord`` by which a node names the fedunlearn client it hosts."""
    return ConfigRecord({"client-id": int(client_id)})


def train_content(
    global_params: torch.Tensor,
    tasks: Sequence[tuple[int, int]],
    *,
    round_: int,
    spec: LocalTrainingSpec,
    run_config: str,
) -> RecordDict:
    """Return the content of a ``train`` message offering ``(client_id, seed)`` tasks."""
    task = ConfigRecord(
        {
            "client-ids": [int(c) for c, _ in tasks],
            "seeds": [int(s) for _, s in tasks],  # 63-bit ints; ConfigRecord keeps int64
            "round": int(round_),
            "epochs": int(spec.epochs),
            "lr": float(spec.lr),
            "batch-size": int(spec.batch_size),
            "momentum": float(spec.momentum),
            "weight-decay": float(spec.weight_decay),
            "steps": int(spec.steps or 0),  # tv_stable: local mini-batch steps (0: epochs)
            "run-config": run_config,
        }
    )
    return RecordDict({"global": ArrayRecord([_array(global_params)]), "task": task})


def read_train_task(message: Message) -> TrainTask:
    """Decode a ``train`` message.

    Raises:
        FlowerProtocolError: if a record or key is missing.
    """
    try:
        task = wire_values(message.content["task"])
        spec = LocalTrainingSpec(
            epochs=int(task["epochs"]),
            lr=float(task["lr"]),
            batch_size=int(task["batch-size"]),
            momentum=float(task["momentum"]),
            weight_decay=float(task["weight-decay"]),
            steps=int(task.get("steps", 0)) or None,
        )
        return TrainTask(
            seeds=dict(zip(map(int, task["client-ids"]), map(int, task["seeds"]), strict=True)),
            round=int(task["round"]),
            spec=spec,
            run_config=str(task["run-config"]),
            global_params=_tensor(array_record(message.content["global"])),
        )
    except KeyError as err:
        raise FlowerProtocolError(
            f"a fedunlearn train message lacks {err}; server and client must run the same "
            "fedunlearn version"
        ) from None


def reply_content(update: ClientUpdate) -> RecordDict:
    """Return the content of a client's reply to a ``train`` message."""
    return RecordDict(
        {
            "delta": ArrayRecord([_array(update.delta)]),
            "metrics": MetricRecord(
                {"num-samples": int(update.num_samples), "train-loss": float(update.train_loss)}
            ),
            "client": client_echo(update.client_id),
        }
    )


def idle_content(client_id: int) -> RecordDict:
    """Return the reply of a node whose client was not asked to train."""
    return RecordDict({"client": client_echo(client_id)})


def echoed_client(message: Message) -> int:
    """Return the fedunlearn client id a reply names.

    Raises:
        FlowerProtocolError: if the reply carries no ``client`` record.
    """
    try:
        return int(wire_values(message.content["client"])["client-id"])
    except KeyError:
        raise FlowerProtocolError(
            "a reply does not name its fedunlearn client (ConfigRecord 'client' with "
            "'client-id'); is the SuperNode running fedunlearn's ClientApp?"
        ) from None


def read_update(message: Message) -> ClientUpdate | None:
    """Decode a client's reply to a ``train`` message (None for an idle reply)."""
    if "delta" not in message.content:
        return None
    metrics = wire_values(message.content["metrics"])
    return ClientUpdate(
        client_id=echoed_client(message),
        delta=_tensor(array_record(message.content["delta"])),
        num_samples=int(metrics["num-samples"]),
        train_loss=float(metrics["train-loss"]),
    )
