"""The ServerApp: FedAvg of the linear classifier; the final weights saved as final_model.npz."""

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from digits_numpy.task import initial_weights

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    strategy = FedAvg(fraction_train=float(config["fraction-train"]))
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(initial_weights()),
        num_rounds=int(config["num-server-rounds"]),
        train_config=ConfigRecord({"lr": config["learning-rate"]}),
    )
    np.savez("final_model.npz", *result.arrays.to_numpy_ndarrays())
