"""own_app: a plain Flower ClientApp, built with fedunlearn's ``ClientApp`` (Flower's, plus ids).

fedunlearn's ``ClientApp`` tags each train reply with the stable client id and seeds each
training from the server's seed; ``losses=`` (optional) lets the forgotten client's node report
its own loss under the old and the unlearned model. ``train`` reads the learning rate and local
epochs from the message's config record, so fedunlearn's fresh training for unlearning, which
sends the run's ``lr`` and ``local-epochs``, needs nothing more.
"""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict

from fedunlearn.integrations.flower import ClientApp, client_id
from own_app.task import Net, load_data, losses, test, train


def _data(msg: Message, context: Context) -> tuple[int, tuple, tuple]:
    cid = client_id(msg, context)  # the node's partition-id (or the one a message names)
    train_set, test_set = load_data(cid, int(context.node_config["num-partitions"]))
    return cid, train_set, test_set


def client_losses(arrays: ArrayRecord, cid: int, context: Context) -> list[float]:
    """The per-sample losses of this client's own training data (fedunlearn's client check)."""
    net = Net()
    net.load_state_dict(arrays.to_torch_state_dict())
    train_set, _ = load_data(cid, int(context.node_config["num-partitions"]))
    return losses(net, train_set).tolist()


app = ClientApp(losses=client_losses)


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    """Train the received model on this node's data."""
    _, train_set, _ = _data(msg, context)
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    config = msg.content["config"]
    epochs = int(config.get("local-epochs", context.run_config["local-epochs"]))
    loss = train(net, train_set, epochs, float(config["lr"]))
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(train_set[1])})
    return Message(
        RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics}), reply_to=msg
    )


@app.evaluate()
def evaluate_fn(msg: Message, context: Context) -> Message:
    """Evaluate the received model on this node's held-out data (Flower's federated evaluation)."""
    _, _, test_set = _data(msg, context)
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    loss, acc = test(net, test_set)
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": acc, "num-examples": len(test_set[1])})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
