"""own_app: the ServerApp: FedAvg wrapped in fedunlearn's ``Recording``; unlearning on request.

The server holds no data: evaluation is Flower's federated evaluation on the nodes. With the
run config key ``unlearn-forget`` set, the same app serves an unlearning request instead of
training (``unlearn_from_run_config``).
"""

from __future__ import annotations

from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fedunlearn.integrations.flower import Recording, unlearn_from_run_config
from own_app.task import INPUT_SHAPE, NUM_CLASSES, make_net

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Train with recording, or serve the unlearning request the run config names."""
    rc = context.run_config
    if unlearn_from_run_config(grid, context):
        return
    run_dir = str(rc["run-dir"]) or str(Path.home() / "fedunlearn-runs" / f"own-{context.run_id}")
    strategy = Recording(
        FedAvg(fraction_train=float(rc["fraction-train"]), fraction_evaluate=1.0),
        run_dir=run_dir,
        model="own_app.task:make_net",
        input_shape=INPUT_SHAPE,
        num_classes=NUM_CLASSES,
        local_epochs=int(rc["local-epochs"]),
    )
    strategy.start(
        grid,
        ArrayRecord(make_net(INPUT_SHAPE, NUM_CLASSES).state_dict()),
        num_rounds=int(rc["num-server-rounds"]),
        train_config=ConfigRecord({"lr": float(rc["lr"])}),
    )
