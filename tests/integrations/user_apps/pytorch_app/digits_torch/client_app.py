"""The ClientApp: local training and evaluation on the node's own partition."""

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from digits_torch.task import Net, evaluate, load_partition, train

app = ClientApp()


def _partition(context: Context):
    node = context.node_config
    return load_partition(int(node["partition-id"]), int(node["num-partitions"]))


def _model(msg: Message) -> Net:
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    return net


@app.train()
def train_step(msg: Message, context: Context) -> Message:
    net = _model(msg)
    train_set, _ = _partition(context)
    loss = train(
        net,
        train_set,
        epochs=int(context.run_config["local-epochs"]),
        lr=float(msg.content["config"]["lr"]),
        batch_size=int(context.run_config["batch-size"]),
    )
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(train_set[1])})
    content = RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate_step(msg: Message, context: Context) -> Message:
    net = _model(msg)
    _, val_set = _partition(context)
    loss, accuracy = evaluate(net, val_set)
    metrics = MetricRecord(
        {"eval_loss": loss, "eval_acc": accuracy, "num-examples": len(val_set[1])}
    )
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
