"""The ClientApp: a few epochs of gradient descent on the node's data, and evaluation."""

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from digits_numpy.task import fit, node_data, score

app = ClientApp()


def _data(context: Context):
    return node_data(
        int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    )


@app.train()
def train(msg: Message, context: Context) -> Message:
    weights = msg.content["arrays"].to_numpy_ndarrays()
    x, y = _data(context)
    epochs = int(context.run_config["local-epochs"])
    weights, loss = fit(weights, x, y, epochs, float(msg.content["config"]["lr"]))
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(y)})
    reply = RecordDict({"arrays": ArrayRecord(weights), "metrics": metrics})
    return Message(content=reply, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    x, y = _data(context)
    loss, accuracy = score(msg.content["arrays"].to_numpy_ndarrays(), x, y)
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": accuracy, "num-examples": len(y)})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
