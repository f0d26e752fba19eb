"""What fedunlearn adds to a user's own Flower app: client ids, array layout, reply checks.

A user's ClientApp stays a plain Flower ClientApp (``@app.train()`` loads ``"arrays"``, trains,
returns its arrays and a ``MetricRecord`` with ``num-examples``). fedunlearn's ``ClientApp`` is
Flower's with three things added, so that changing the import line is all an app does
(``from fedunlearn.integrations.flower import ClientApp``); ``own_client_app(...)`` builds the
same:

- every train reply carries the *stable* client id in ``ConfigRecord`` ``"fedunlearn"``
  (``client-id``), read from the node config (``client_key``, default ``partition-id``), not
  Flower's random node id. A node may host several clients: its node config value is then a
  comma-separated list (``"3,4"``), a train message picks one with the config key
  ``fedunlearn.client-id``, and the user's handler reads it with ``client_id(message,
  context)``;
- every train handler runs with Python's, NumPy's and torch's global random generators seeded
  from the seed the server derived for this client and round (``client_seed``), and restored
  afterwards: a handler drawing its batch order from them (a ``DataLoader(shuffle=True)``)
  trains the same way whenever the same round is computed again (an exact replay);
- a ``query.fedunlearn`` handler: ``want = "client-ids"`` answers which clients the node hosts
  and whether it computes losses (unlearning finds its clients' nodes with it), ``want =
  "losses"`` (only when the app was given a ``losses`` function) returns a client's per-sample
  losses on its own training data for the arrays sent (the receipt's per-client checks: the
  data never leaves the node).

Fresh training for unlearning is an ordinary ``train`` message to the same ClientApp:
``ArrayRecord`` ``"arrays"`` (the start model, with the recorded run's keys and shapes) and
``ConfigRecord`` ``"config"`` with the keys ``TRAIN_KEYS`` (``lr``, ``local-epochs``,
``batch-size``, ``fedunlearn.client-id``, ``fedunlearn.round``, ``fedunlearn.seed``); a handler
that honours ``lr`` and ``local-epochs`` (as Flower's PyTorch quickstart reads them) trains as
asked. Under deletion-ready sampling (``tv_stable``) the config also holds ``local-steps``, the
``fedunlearn.multiplicity`` the server weighs the reply by, and a handler draws its mini-batches
with ``local_batches`` (FATS's deletion-consistent batches).

``ArrayLayout`` maps a Flower ``ArrayRecord`` (a ``state_dict``'s keys and shapes) to the flat
float32 vector fedunlearn's history stores (``fedunlearn.models.get_flat_params``'s order: the
parameters, then the persistent buffers such as BatchNorm's running statistics, integer ones as
float32) and back. ``check_reply`` turns one train reply into ``(client id, flat arrays,
num-examples, train loss)`` or one line saying why it is rejected (no client id, wrong keys or
shapes, non-finite or huge values, no sample count).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp as FlowerClientApp
from flwr.clientapp.typing import Mod

from fedunlearn.errors import ConfigError
from fedunlearn.fl.sampling import step_batches
from fedunlearn.fl.seeding import derive_seed
from fedunlearn.integrations.flower.messages import array_record, wire_values

RECORD = "fedunlearn"  # ConfigRecord of fedunlearn's keys, in requests and replies
CLIENT_ID = "client-id"  # in RECORD of a reply: the stable client id
QUERY_ACTION = "fedunlearn"  # message type "query.fedunlearn"
QUERY_TYPE = f"query.{QUERY_ACTION}"
CONFIG_CLIENT = "fedunlearn.client-id"  # train config: which hosted client trains
CONFIG_ROUND = "fedunlearn.round"
CONFIG_SEED = "fedunlearn.seed"  # the client's own seed (unlearning's messages name one client)
CONFIG_RUN_SEED = "fedunlearn.run-seed"  # the run seed: a client derives its own from it
CONFIG_SALT = "fedunlearn.salt"
CONFIG_MULTIPLICITY = "fedunlearn.multiplicity"  # tv_stable: the draws this client won
LOCAL_STEPS = "local-steps"
TRAIN_KEYS = ("lr", "local-epochs", "batch-size", CONFIG_CLIENT, CONFIG_ROUND, CONFIG_SEED)
DEFAULT_CLIENT_KEY = "partition-id"
DEFAULT_WEIGHT_KEY = "num-examples"
LOSS_KEYS = ("train_loss", "train-loss", "loss")
# A reply whose arrays exceed this (max |value|) is rejected: no trained model holds such values
DEFAULT_MAX_ABS = 1e6

LossFn = Callable[[ArrayRecord, int, Context], Sequence[float]]


def hosted_clients(context: Context, key: str = DEFAULT_CLIENT_KEY) -> tuple[int, ...]:
    """Return the stable client ids a node hosts (its node config ``key``: ``3`` or ``"3,4"``).

    Raises:
        ConfigError: the node config lacks ``key`` or it is not integer ids.
    """
    value = context.node_config.get(key)
    try:
        if isinstance(value, int | np.integer):
            return (int(value),)
        ids = tuple(int(v) for v in str(value).split(",") if v.strip())
        if not ids or value is None:
            raise ValueError
        return ids
    except (TypeError, ValueError):
        raise ConfigError(
            f"this SuperNode's node config needs '{key}', the client id(s) it hosts (an integer "
            f'or e.g. "3,4"); got {value!r}'
        ) from None


def client_id(message: Message, context: Context, key: str = DEFAULT_CLIENT_KEY) -> int:
    """Return the client a train message is for: its ``fedunlearn.client-id``, else the node's.

    Raises:
        ConfigError: the node hosts several clients and the message names none of them, or it
            names a client the node does not host.
    """
    hosted = hosted_clients(context, key)
    config = message.content.config_records.get("config")
    asked: Any = config.get(CONFIG_CLIENT) if config is not None else None  # int() checks it
    if asked is None:
        if len(hosted) > 1:
            raise ConfigError(
                f"this node hosts clients {list(hosted)}; the train message must name one "
                f"({CONFIG_CLIENT})"
            )
        return hosted[0]
    if int(asked) not in hosted:
        raise ConfigError(f"asked to train client {asked}; this node hosts {list(hosted)}")
    return int(asked)


def client_seed(message: Message, context: Context, key: str = DEFAULT_CLIENT_KEY) -> int | None:
    """Return the seed the server derived for this client's training, or None if it sent none.

    The message names it (``fedunlearn.seed``), or names the run seed and round from which the
    client derives it as the in-process engine does (``derive_seed(seed, "client", round,
    client, salt)``).
    """
    config = message.content.config_records.get("config")
    if config is None:
        return None
    if CONFIG_SEED in config:
        return int(config[CONFIG_SEED])  # type: ignore[arg-type]
    if CONFIG_RUN_SEED not in config or CONFIG_ROUND not in config:
        return None
    return derive_seed(
        int(config[CONFIG_RUN_SEED]),  # type: ignore[arg-type]
        "client",
        int(config[CONFIG_ROUND]),  # type: ignore[arg-type]
        client_id(message, context, key),
        int(config.get(CONFIG_SALT, 0)),  # type: ignore[arg-type]
    )


@contextmanager
def seeded(seed: int | None) -> Iterator[None]:
    """Seed Python's, NumPy's and torch's global generators for the block; restore them after."""
    if seed is None:
        yield
        return
    # the global generators are the point: the app's handler draws from them (np.random.rand)
    py_state, np_state = random.getstate(), np.random.get_state()  # noqa: NPY002
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            random.seed(seed)
            np.random.seed(seed % 2**32)  # noqa: NPY002
            torch.manual_seed(seed)
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)  # noqa: NPY002


def local_batches(
    message: Message,
    context: Context,
    sample_ids: Sequence[int] | np.ndarray | int,
    key: str = DEFAULT_CLIENT_KEY,
) -> list[np.ndarray] | None:
    """Return the mini-batches (positions in the client's data) a tv_stable round asks for.

    FATS's local work (deletion-ready training, ``fedunlearn.fl.sampling.step_batches``):
    ``local-steps`` mini-batches of ``batch-size`` samples, each drawn without replacement by
    keys of the samples' stable ids, from the seed of this client and round, so deleting a
    sample changes only the batches that drew it. None when the message asks for ordinary
    local epochs (train as usual).

    Args:
        message: The train message.
        context: The node's context.
        sample_ids: The stable ids of the client's training samples (or their count n: ids
            0..n-1, the positions of a dataset that never reorders).
        key: The node config key naming the client id(s) a node hosts.
    """
    config = message.content.config_records.get("config")
    if config is None or LOCAL_STEPS not in config:
        return None
    seed = client_seed(message, context, key)
    if seed is None:
        raise ConfigError(
            "a tv_stable train message carries no seed (fedunlearn.seed or fedunlearn.run-seed)"
        )
    ids = np.arange(sample_ids) if isinstance(sample_ids, int) else np.asarray(sample_ids)
    return step_batches(seed, ids, int(config["batch-size"]), int(config[LOCAL_STEPS]))  # type: ignore[arg-type]


def _echo_mod(key: str) -> Mod:
    def mod(message: Message, context: Context, call_next: Callable) -> Message:
        if message.metadata.message_type.split(".")[0] != "train":
            return call_next(message, context)
        with seeded(client_seed(message, context, key)):
            reply = call_next(message, context)
        if reply.has_error():
            return reply
        if RECORD not in reply.content.config_records:  # the handler may name it itself
            reply.content[RECORD] = ConfigRecord({CLIENT_ID: client_id(message, context, key)})
        return reply

    return mod


class ClientApp(FlowerClientApp):
    """Flower's ``ClientApp`` that fedunlearn's ``Recording`` and unlearning can address.

    A drop-in for ``flwr.clientapp.ClientApp``: register the usual handlers on it
    (``@app.train()``, ``@app.evaluate()``); every train reply is tagged with the client id,
    train handlers run seeded, and ``query.fedunlearn`` is answered (module docstring).

    Args:
        client_fn: Flower's legacy ``client_fn`` (passed on unchanged).
        mods: Flower mods, outermost first (fedunlearn's own runs outside them).
        client_key: The node config key naming the client id(s) a node hosts.
        losses: ``(arrays, client_id, context) -> per-sample losses`` of the client's own
            training data under ``arrays`` (optional; without it the receipt's per-client
            check says "not provided").
    """

    def __init__(
        self,
        client_fn: Callable[..., Any] | None = None,
        mods: list[Mod] | None = None,
        *,
        client_key: str = DEFAULT_CLIENT_KEY,
        losses: LossFn | None = None,
    ) -> None:
        super().__init__(client_fn=client_fn, mods=[_echo_mod(client_key), *(mods or [])])
        self.client_key = client_key
        self.losses = losses
        self.query(QUERY_ACTION)(self._answer)

    def _answer(self, message: Message, context: Context) -> Message:
        want = str(message.content[RECORD].get("want", ""))
        key = self.client_key
        if want == "client-ids":
            ids = list(hosted_clients(context, key))
            record = ConfigRecord({"client-ids": ids, "losses": self.losses is not None})
            return Message(RecordDict({RECORD: record}), reply_to=message)
        if want == "losses":
            if self.losses is None:
                raise ConfigError(
                    "this ClientApp computes no losses for fedunlearn (ClientApp(losses=...))"
                )
            cid = int(wire_values(message.content[RECORD])[CLIENT_ID])
            if cid not in hosted_clients(context, key):
                raise ConfigError(f"asked for client {cid}'s losses; this node does not host it")
            arrays = array_record(message.content["arrays"])
            values = np.asarray(self.losses(arrays, cid, context), np.float64)
            losses = ArrayRecord({"losses": Array(values.reshape(-1))})
            return Message(
                RecordDict({"losses": losses, RECORD: ConfigRecord({CLIENT_ID: cid})}),
                reply_to=message,
            )
        raise ConfigError(f"unknown fedunlearn query {want!r} (client-ids, losses)")


def own_client_app(
    *, client_key: str = DEFAULT_CLIENT_KEY, losses: LossFn | None = None
) -> ClientApp:
    """Return fedunlearn's ``ClientApp`` (the same as ``ClientApp(client_key=, losses=)``).

    Args:
        client_key: The node config key naming the client id(s) a node hosts.
        losses: ``(arrays, client_id, context) -> per-sample losses`` of the client's own
            training data under ``arrays`` (optional; the receipt's per-client checks use it).
    """
    return ClientApp(client_key=client_key, losses=losses)


@dataclass(frozen=True)
class ArrayLayout:
    """The keys, shapes and dtypes of a model's ``ArrayRecord``, in order."""

    keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]

    @classmethod
    def of(cls, record: ArrayRecord, order: Sequence[str] | None = None) -> ArrayLayout:
        """Return the layout of ``record``, its arrays in ``order`` (default: the record's).

        ``order`` is the model's flat-vector order (``fedunlearn.models.get_flat_params``: the
        parameters, then the persistent buffers); a ``state_dict`` interleaves them.

        Raises:
            ConfigError: an array is neither floating point nor integer, or ``order`` does
                not name the record's arrays.
        """
        keys = tuple(order) if order is not None else tuple(record.keys())
        if sorted(keys) != sorted(record.keys()):
            raise ConfigError(
                f"the arrays {sorted(record.keys())[:4]}... are not the model's "
                f"{sorted(keys)[:4]}..."
            )
        shapes, dtypes = [], []
        for key in keys:
            array = record[key]
            kind = np.dtype(array.dtype)
            if not (np.issubdtype(kind, np.floating) or np.issubdtype(kind, np.integer)):
                raise ConfigError(
                    f"array {key!r} has dtype {array.dtype}: fedunlearn records numeric arrays "
                    "(floating point, or integer buffers such as num_batches_tracked)"
                )
            shapes.append(tuple(int(s) for s in array.shape))
            dtypes.append(str(array.dtype))
        return cls(keys, tuple(shapes), tuple(dtypes))

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> ArrayLayout:
        """Return the layout stored by ``to_meta``."""
        return cls(
            tuple(meta["keys"]), tuple(tuple(s) for s in meta["shapes"]), tuple(meta["dtypes"])
        )

    def to_meta(self) -> dict[str, Any]:
        """Return the layout as JSON-ready lists."""
        return {
            "keys": list(self.keys),
            "shapes": [list(s) for s in self.shapes],
            "dtypes": list(self.dtypes),
        }

    @property
    def size(self) -> int:
        """d, the length of the flat vector."""
        return sum(math.prod(s) for s in self.shapes)

    def problem(self, record: ArrayRecord) -> str | None:
        """Return what makes ``record`` unlike this layout (None if it matches)."""
        keys = set(record.keys())
        if keys != set(self.keys):
            extra, lacking = sorted(keys - set(self.keys)), sorted(set(self.keys) - keys)
            return f"arrays do not match the model's (extra {extra}, missing {lacking})"
        for key, shape in zip(self.keys, self.shapes, strict=True):
            got = tuple(int(s) for s in record[key].shape)
            if got != shape:
                return f"array {key!r} has shape {got}; the model's is {shape}"
        return None

    def flatten(self, record: ArrayRecord) -> torch.Tensor:
        """Return the arrays of ``record`` as one float32 vector (in the layout's order)."""
        parts = [np.asarray(record[k].numpy(), dtype=np.float32).reshape(-1) for k in self.keys]
        return torch.from_numpy(np.concatenate(parts) if parts else np.zeros(0, np.float32))

    def record(self, flat: torch.Tensor) -> ArrayRecord:
        """Return the ``ArrayRecord`` of a flat vector (each array in its recorded dtype)."""
        values = flat.detach().to(torch.float32).cpu().numpy()
        if values.shape != (self.size,):
            raise ConfigError(
                f"flat vector has shape {values.shape}; the model needs ({self.size},)"
            )
        out, offset = {}, 0
        for key, shape, dtype in zip(self.keys, self.shapes, self.dtypes, strict=True):
            n = math.prod(shape)
            part = values[offset : offset + n].reshape(shape)
            if np.issubdtype(np.dtype(dtype), np.integer):
                part = np.rint(part)  # integer buffers travel as float32 (exact to 2^24)
            out[key] = Array(np.asarray(part, dtype=dtype))
            offset += n
        return ArrayRecord(out)


@dataclass(frozen=True)
class Reply:
    """One accepted train reply."""

    client_id: int
    params: torch.Tensor  # the client's returned model, flat
    num_samples: int
    loss: float | None
    node: int


def reply_client(message: Message) -> int | None:
    """Return the client id a reply names (``ConfigRecord`` ``fedunlearn``, else metrics)."""
    content = message.content
    if RECORD in content.config_records and CLIENT_ID in content[RECORD]:
        return int(content[RECORD][CLIENT_ID])  # type: ignore[arg-type]
    for metrics in content.metric_records.values():
        if CLIENT_ID in metrics:
            return int(metrics[CLIENT_ID])  # type: ignore[arg-type]
    return None


def check_reply(
    message: Message,
    layout: ArrayLayout,
    *,
    weight_key: str = DEFAULT_WEIGHT_KEY,
    max_abs: float = DEFAULT_MAX_ABS,
) -> tuple[int | None, Reply | str]:
    """Return ``(client id or None, accepted Reply or why it is rejected)`` of a train reply."""
    node = int(message.metadata.src_node_id)
    cid = reply_client(message)
    if cid is None:
        return None, (
            f"reply from node {node} names no client id: build the ClientApp with "
            "fedunlearn's own_client_app() or put 'client-id' in its MetricRecord"
        )
    content = message.content
    arrays = list(content.array_records.values())
    if len(arrays) != 1:
        return cid, f"client {cid}: the reply holds {len(arrays)} ArrayRecords; expected one"
    problem = layout.problem(arrays[0])
    if problem is not None:
        return cid, f"client {cid}: {problem}"
    params = layout.flatten(arrays[0])
    finite = torch.isfinite(params)
    if not bool(finite.all()):
        return cid, f"client {cid}: {int((~finite).sum())} non-finite values in its arrays"
    biggest = float(params.abs().max()) if params.numel() else 0.0
    if biggest > max_abs:
        return cid, f"client {cid}: values up to {biggest:.3g} exceed {max_abs:g}"
    metrics = [wire_values(m) for m in content.metric_records.values()]
    weight = metrics[0].get(weight_key) if len(metrics) == 1 else None
    if weight is None or not float(weight) >= 0 or float(weight) != int(float(weight)):
        return cid, f"client {cid}: no non-negative integer '{weight_key}' in one MetricRecord"
    loss = next((float(metrics[0][k]) for k in LOSS_KEYS if k in metrics[0]), None)
    return cid, Reply(cid, params, int(float(weight)), loss, node)
