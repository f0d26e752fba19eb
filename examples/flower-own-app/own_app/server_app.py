"""own_app: the ServerApp: Flower's FedAvg in fedunlearn's ``Recording``.

The server holds no data: evaluation is Flower's federated evaluation on the nodes.
``Recording(strategy, context)`` records every round into a fedunlearn run, and when
``fedunlearn unlearn`` has queued a request for one of the app's runs, the same ``start``
serves it instead of training (docs/deployment.md, "Your own Flower app").
"""

from __future__ import annotations

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fedunlearn.integrations.flower import Recording
from own_app.task import Net

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Train with recording, or serve the unlearning request queued for the app."""
    rc = context.run_config
    fedavg = FedAvg(fraction_train=float(rc["fraction-train"]), fraction_evaluate=1.0)
    strategy = Recording(fedavg, context)  # run-dir and local-epochs: from the run config
    strategy.start(
        grid,
        ArrayRecord(Net().state_dict()),
        num_rounds=int(rc["num-server-rounds"]),
        train_config=ConfigRecord({"lr": float(rc["lr"])}),
    )
