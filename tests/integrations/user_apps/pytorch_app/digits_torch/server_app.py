"""The ServerApp: FedAvg over the nodes, the global model tested on the server's test set."""

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from digits_torch.task import Net, evaluate, load_test_set

app = ServerApp()


def central_evaluation(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    net = Net()
    net.load_state_dict(arrays.to_torch_state_dict())
    loss, accuracy = evaluate(net, load_test_set())
    return MetricRecord({"accuracy": accuracy, "loss": loss})


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    fraction_train = float(config["fraction-train"])
    fraction_evaluate = float(config["fraction-evaluate"])
    strategy = FedAvg(fraction_train=fraction_train, fraction_evaluate=fraction_evaluate)
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(Net().state_dict()),
        num_rounds=int(config["num-server-rounds"]),
        train_config=ConfigRecord({"lr": config["learning-rate"]}),
        evaluate_fn=central_evaluation,
    )
    torch.save(result.arrays.to_torch_state_dict(), "final_model.pt")
