"""``fedunlearn demo``'s deletion-ready part: the same data trained to be deleted from cheaply.

Trains the digits data as 100 clients with TV-stable sampling (``DEMO_DELETION_READY``) and, for
the accuracy it costs, plain FedAvg with the same participation and the same local work; then
serves ten deletion requests one after the other with ``tv_exact`` (each verified and applied)
and prints what they cost beside Retrain, in a few lines.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, cast

from rich.console import Console

__all__ = ["run_deletion_ready_demo"]

REQUESTS = 10


def run_deletion_ready_demo(out: Path, console: Console) -> dict[str, Any]:
    """Train the demo's deletion-ready run under ``out`` and serve ``REQUESTS`` requests."""
    import numpy as np

    from fedunlearn.config import parse_config
    from fedunlearn.experiments.deletion_ready import DEMO_DELETION_READY, serve_requests
    from fedunlearn.runs import holds_run, train_run

    config = parse_config(DEMO_DELETION_READY, "the demo's deletion-ready config")
    training = config.training
    assert training.local_steps is not None  # the demo's deletion-ready config sets it
    plain = parse_config(
        {
            **DEMO_DELETION_READY,
            "training": {
                **{k: v for k, v in DEMO_DELETION_READY["training"].items() if k != "local_steps"},
                "sampling": "fraction",
                # the same local work: E x b samples per participation, as epochs of ~18 samples
                "local_epochs": max(1, round(training.local_steps * training.batch_size / 18)),
            },
        },
        "the demo's FedAvg config",
    )
    # beside the demo's run, not inside it (a run directory holds one run)
    ready = out.with_name(f"{out.name}_deletion_ready")
    fedavg = out.with_name(f"{out.name}_deletion_ready_fedavg")
    console.print(
        f"Deletion-ready training of the same data: {config.data.num_clients} clients, "
        f"{max(1, round(training.participation * config.data.num_clients))} draw(s) per round, "
        f"{training.rounds} rounds (rho_C = 0.5) ..."
    )
    for cfg, path in ((config, ready), (plain, fedavg)):
        if not holds_run(path):
            train_run(cfg, path)
    accuracy = {
        name: _final_accuracy(path) for name, path in (("ready", ready), ("fedavg", fedavg))
    }
    clients = [int(c) for c in np.random.default_rng(0).choice(100, REQUESTS, replace=False)]
    served = serve_requests(ready, clients) if _generation(ready) == 0 else None
    if served is None:
        console.print(f"{ready} served its requests in an earlier demo; remove it to serve again")
        return {"accuracy": accuracy}
    requests, retrain = served["requests"], served["retrain_trajectories"]
    free = sum(r["trajectories"] == 0 for r in requests)
    mean = statistics.mean(r["trajectories"] for r in requests)
    exact = sum(r["influence"] == "removed" and r["lineage"] == "exact" for r in requests)
    console.print(
        f"  accuracy {100 * accuracy['ready']:.1f}% (FedAvg, same participation and local work: "
        f"{100 * accuracy['fedavg']:.1f}%)\n"
        f"  {REQUESTS} deletion requests served one after the other with tv_exact, each applied: "
        f"{free} recomputed nothing; mean {mean:.1f} client trajectories = "
        f"{mean / retrain:.2f}x Retrain's {retrain}; {exact}/{REQUESTS} REMOVED by construction "
        "(exact lineage)"
    )
    return {"accuracy": accuracy, **served}


def _final_accuracy(run: Path) -> float:
    from fedunlearn.history.store import HistoryStore
    from fedunlearn.runs import HISTORY_DIR

    with HistoryStore.open(run / HISTORY_DIR) as store:
        accuracy = store.round_scalars(store.last_round() or 0).get("test_accuracy", 0.0)
        return float(cast(float, accuracy))


def _generation(run: Path) -> int:
    from fedunlearn.history.store import HistoryStore
    from fedunlearn.runs import HISTORY_DIR

    with HistoryStore.open(run / HISTORY_DIR) as store:
        return store.generation()
