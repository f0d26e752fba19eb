"""Flower ``ClientApp`` whose training is fedunlearn's pure ``local_update``.

A SuperNode hosts one fedunlearn client: its node config names it (``partition-id``, which the
Simulation Engine sets to 0..N-1 and a deployment passes with ``--node-config``) and may point
at the data (``data-dir``, an absolute path; default: the run config's ``data.data_dir``,
else ``$FEDUNLEARN_DATA``). The client rebuilds the run's data exactly as ``build_setup`` does
(same partition, same poisoning of malicious clients) from the run config the server sends,
once per process, and trains its own partition only. Every reply echoes the client id.
Training runs on the run config's ``training.device`` as resolved on the node (``auto``: the
node's GPU if torch sees one); the client's data is copied to that device once per process.

Handlers (Flower's ``(Message, Context) -> Message``):

- ``query``: reply with the hosted client id;
- ``train``: find the hosted client in the task's list (else reply idle), run ``local_update``
  with the server's seed and hyperparameters, reply with the delta, sample count and loss.

An exception in a handler becomes an error reply (Flower does this); the server records the
client as missing for that round.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import yaml
from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import Mod
from torch import nn

from fedunlearn.config import RunConfig, parse_config
from fedunlearn.errors import ConfigError
from fedunlearn.fl.client import local_update
from fedunlearn.fl.executors import executor_device
from fedunlearn.fl.records import ClientData
from fedunlearn.integrations.flower.messages import idle_content, read_train_task, reply_content
from fedunlearn.runs import build_setup

PARTITION_KEY = "partition-id"
DATA_DIR_KEY = "data-dir"


def hosted_client(context: Context) -> int:
    """Return the fedunlearn client id this node hosts (its ``partition-id``).

    Raises:
        ConfigError: if the node config has no integer ``partition-id``.
    """
    value = context.node_config.get(PARTITION_KEY)
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(
            f"this SuperNode's node config needs an integer '{PARTITION_KEY}' (the fedunlearn "
            f"client id it hosts); got {value!r}. Start it with "
            "--node-config \"partition-id=0 data-dir='/abs/path'\""
        ) from None


@functools.lru_cache(maxsize=2)
def _run_data(config_yaml: str, data_dir: str | None) -> tuple[nn.Module, dict[int, ClientData]]:
    """Return the model template and every client's data under a run config (cached).

    One process may serve many clients (the Simulation Engine's actors do), so the whole
    federation's data is built once per process and run config, as ``build_setup`` builds it.
    """
    config: RunConfig = parse_config(yaml.safe_load(config_yaml), "<server run config>")
    if data_dir:
        config = config.model_copy(
            update={"data": config.data.model_copy(update={"data_dir": data_dir})}
        )
    setup = build_setup(config)
    setup.close()
    return setup.model, setup.federation.client_data


@functools.lru_cache(maxsize=4)
def _placed_client(
    config_yaml: str, data_dir: str | None, client_id: int
) -> tuple[nn.Module, ClientData]:
    """Return the model template and one client's data on the run's device (cached)."""
    model, client_data = _run_data(config_yaml, data_dir)
    if client_id not in client_data:
        raise ConfigError(
            f"this node hosts client {client_id}, but the run has clients "
            f"0..{len(client_data) - 1}; fix the node's '{PARTITION_KEY}'"
        )
    training = parse_config(yaml.safe_load(config_yaml), "<server run config>").training
    device = executor_device(training.executor, training.device)
    data = client_data[client_id]
    return model, ClientData(data.x.to(device), data.y.to(device), data.ids)


def load_client(config_yaml: str, context: Context) -> tuple[nn.Module, ClientData]:
    """Return the model template and the hosted client's training data for a run config.

    The data is on the device the run config's ``training.device`` means on this node.

    Raises:
        ConfigError: if the run has no client with the node's ``partition-id``.
    """
    data_dir = context.node_config.get(DATA_DIR_KEY)
    return _placed_client(config_yaml, str(data_dir) if data_dir else None, hosted_client(context))


def handle_query(message: Message, context: Context) -> Message:
    """Reply with the fedunlearn client id this node hosts."""
    return Message(idle_content(hosted_client(context)), reply_to=message)


def handle_train(message: Message, context: Context) -> Message:
    """Run ``local_update`` for the hosted client if the task lists it; reply with its upload."""
    task = read_train_task(message)
    hosted = hosted_client(context)
    if hosted not in task.seeds:
        return Message(idle_content(hosted), reply_to=message)
    model, data = load_client(task.run_config, context)
    update = local_update(model, task.global_params, data, task.spec, task.seeds[hosted], hosted)
    return Message(reply_content(update), reply_to=message)


def make_client_app(mods: Sequence[Mod] = ()) -> ClientApp:
    """Return fedunlearn's ``ClientApp``, with Flower client mods wrapped around it.

    Args:
        mods: Flower mods (``(Message, Context, call_next) -> Message``), outermost first
            (e.g. one that injects failures in tests).
    """
    app = ClientApp(mods=list(mods))
    app.query()(handle_query)
    app.train()(handle_train)
    return app


app = make_client_app()
