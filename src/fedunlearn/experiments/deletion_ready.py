"""A deletion-ready run served request after request (``fedunlearn demo``'s last part).

What the demo shows beside the approximate methods (docs/methods/deletion_ready.md).

``serve_requests(run_dir, clients)`` serves single-client deletion requests one after the other
with ``tv_exact`` on a run trained with TV-stable sampling, each verified and applied before the
next (the living federation of docs/lifecycle.md), and returns per request what was recomputed,
its cost beside Retrain's and the receipt's verdict. ``DEMO_DELETION_READY`` is the demo's
config: 100 clients of the digits data, one draw per round, 50 rounds (rho_C = 0.5).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedunlearn.eval.plan import ReceiptOptions
from fedunlearn.experiments.compare import unlearn_one
from fedunlearn.experiments.lifecycle import save_for_apply
from fedunlearn.runs.lifecycle import apply_result

__all__ = ["DEMO_DELETION_READY", "serve_requests"]

#: The demo's deletion-ready run: digits, 100 IID clients, K = 1 draw per round, E = 20 steps.
DEMO_DELETION_READY: dict[str, Any] = {
    "seed": 0,
    "data": {"dataset": "digits", "num_clients": 100, "partition": "iid", "min_client_samples": 8},
    "model": {"name": "mlp", "hidden": [64]},
    "training": {
        "rounds": 50,
        "lr": 0.1,
        "batch_size": 8,
        "participation": 0.01,
        "sampling": "tv_stable",
        "local_steps": 20,
    },
    "history": {"policy": "none"},
}


def serve_requests(
    run_dir: str | Path, clients: Sequence[int], *, retrain_cost: int | None = None
) -> dict[str, Any]:
    """Serve one deletion request per client of ``clients`` in order with ``tv_exact``.

    Each request is verified (its receipt; no client-level reference training: the lineage is
    exact) and applied before the next.

    Args:
        run_dir: A run trained with ``training.sampling: tv_stable``.
        clients: The clients asking, in order.
        retrain_cost: Retrain's client trajectories on this run (measured once when None).

    Returns:
        ``{"requests": [{client, recomputed_from, trajectories, seconds, influence, lineage,
        test_accuracy}], "retrain_trajectories", "retrain_seconds"}``.
    """
    run_dir = Path(run_dir)
    out: dict[str, Any] = {"requests": []}
    if retrain_cost is None:
        result, _ = unlearn_one(
            run_dir, [clients[0]], "retrain", verify=False, evaluate_rounds=False
        )
        out["retrain_trajectories"] = result.costs.client_participations
        out["retrain_seconds"] = result.costs.wall_seconds
    else:
        out["retrain_trajectories"] = retrain_cost
    with tempfile.TemporaryDirectory() as work:
        for i, client in enumerate(clients):
            result, summary = unlearn_one(
                run_dir,
                [client],
                "tv_exact",
                receipt=ReceiptOptions(client_test=False),
                evaluate_rounds=False,
            )
            path = Path(work) / f"r{i}.json"
            save_for_apply(path, summary, result)
            path.write_text(json.dumps(summary))
            apply_result(run_dir, path)
            verification = summary.get("verification") or {}
            out["requests"].append(
                {
                    "client": client,
                    "recomputed_from": result.details.recomputed_from_round,
                    "trajectories": result.costs.client_participations,
                    "seconds": result.costs.wall_seconds,
                    "influence": verification.get("influence"),
                    "lineage": result.lineage.kind if result.lineage is not None else None,
                    "test_accuracy": summary.get("test_accuracy"),
                }
            )
    return out
