"""A user's own Flower app in miniature: a tiny model, node-local synthetic data, a ClientApp.

Nothing here is fedunlearn's: the model factory is addressed by import path
(``own_app_support:tiny_net``), every node makes its own data from its client id (the server
never sees it), and the ClientApp is a plain ``@app.train()`` built with ``own_client_app``.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from torch import nn
from torch.nn import functional as F  # noqa: N812

from fedunlearn.integrations.flower.app_protocol import client_id, local_batches, own_client_app

INPUT_SHAPE = (8,)
NUM_CLASSES = 3
MODEL = "own_app_support:tiny_net"


def tiny_net(input_shape: tuple[int, ...], num_classes: int, hidden: int = 6) -> nn.Module:
    """The user's model factory."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(input_shape[0], hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
    )


def bn_net(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A user model with BatchNorm buffers (running mean/var, num_batches_tracked)."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(input_shape[0], 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, num_classes)
    )


FACTORY = {"net": tiny_net}  # the model the ClientApp builds (a test may swap in bn_net)


def node_data(cid: int, n: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``cid``'s own data (made on its node from its id)."""
    rng = np.random.default_rng(100 + cid)
    y = rng.integers(0, NUM_CLASSES, n)
    x = rng.normal(size=(n, INPUT_SHAPE[0])).astype(np.float32) + y[:, None].astype(np.float32)
    return torch.from_numpy(x), torch.from_numpy(y)


def client_losses(arrays: ArrayRecord, cid: int, context: Context) -> list[float]:
    """Per-sample losses of client ``cid``'s own data under ``arrays``."""
    net = FACTORY["net"](INPUT_SHAPE, NUM_CLASSES)
    net.load_state_dict(arrays.to_torch_state_dict())
    net.eval()
    x, y = node_data(cid)
    with torch.no_grad():
        return F.cross_entropy(net(x), y, reduction="none").tolist()


app = own_client_app(losses=client_losses)
TRAINED: list[tuple[int, float, int]] = []  # (client, lr, epochs) of each train call
STEPS: list[int] = []  # local steps of each deletion-ready train call


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Plain Flower training: load the arrays, a few SGD steps, return arrays and num-examples."""
    cid = client_id(msg, context)
    net = FACTORY["net"](INPUT_SHAPE, NUM_CLASSES)
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    config = msg.content["config"]
    lr, epochs = float(config.get("lr", 0.1)), int(config.get("local-epochs", 1))
    TRAINED.append((cid, lr, epochs))
    x, y = node_data(cid)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    # deletion-ready rounds name FATS's mini-batches; otherwise epochs in order, 10 at a time
    batches = local_batches(msg, context, len(y))
    if batches is None:
        batches = [
            torch.arange(i, min(i + 10, len(y)))
            for _ in range(epochs)
            for i in range(0, len(y), 10)
        ]
    else:
        STEPS.append(len(batches))
    for idx in batches:
        opt.zero_grad()
        loss = F.cross_entropy(net(x[idx]), y[idx])
        loss.backward()
        opt.step()
    content = RecordDict(
        {
            "arrays": ArrayRecord(net.state_dict()),
            "metrics": MetricRecord({"train_loss": float(loss.detach()), "num-examples": len(y)}),
        }
    )
    return Message(content, reply_to=msg)


__all__ = ["app", "node_data", "tiny_net"]
