r"""Deletion-ready unlearning is training without the data, bit for bit (design note §6.1).

For each seed, a tiny TV-stable run (sklearn digits, logistic regression, M = 4..8 clients,
K = 2 draws per round, E = 2 local steps of b = 2 samples, R = 5 rounds, serial executor, one
torch thread) is trained with ``fedunlearn.runs.train_run``, and three requests are unlearned
with ``tv_exact`` through ``fedunlearn.unlearn.UnlearnSession``: one client, two samples of one
client, and three clients at once. Each result is compared with training from scratch on the
reduced data with the same seed and sampler (``torch.equal``: any difference is a mismatch),
and its first recomputed round with the first use found independently (the store's client
records, and the client's mini-batches regenerated with ``fl.sampling.step_batches``). The
share of requests that recomputed nothing is compared with the planner's prediction
(``fedunlearn.runs.plan``) for each seed's config, summed over seeds (z of the count).

    nice -n 10 python reproductions/deletion_ready/exactness.py --seeds 200

Prints a Markdown table (docs/deletion_ready.md, "Exactness tests", holds the measured one).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shutil
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedunlearn.config import RunConfig, parse_config
from fedunlearn.fl.engine import run_rounds
from fedunlearn.fl.sampling import step_batches
from fedunlearn.fl.seeding import derive_seed
from fedunlearn.runs import train_run
from fedunlearn.runs.plan import PlanInputs, client_request, sample_request
from fedunlearn.runs.setup import build_setup, sampler_of
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

KINDS = ("one client", "2 samples of one client", "3 clients at once")
ROUNDS, DRAWS, STEPS, BATCH, SAMPLES_PER_CLIENT = 5, 2, 2, 2, 10


def config_of(seed: int) -> RunConfig:
    """The seed's tiny TV-stable run: M = 4 + seed mod 5 clients, K = 2."""
    clients = 4 + seed % 5
    return parse_config(
        {
            "seed": seed,
            "data": {
                "dataset": "digits",
                "num_clients": clients,
                "max_train_samples": SAMPLES_PER_CLIENT * clients,
            },
            "model": {"name": "logreg"},
            "training": {
                "rounds": ROUNDS,
                "lr": 0.3,
                "batch_size": BATCH,
                "participation": DRAWS / clients,
                "sampling": "tv_stable",
                "local_steps": STEPS,
                "executor": "serial",
            },
            "history": {"policy": "all"},
        }
    )


def scratch(config: RunConfig, request: UnlearnRequest) -> torch.Tensor:
    """Train ``config`` from scratch on the reduced data, with the run's sampler and seed."""
    setup = build_setup(config)
    try:
        fed = setup.federation
        if request.samples:
            fed = fed.without_samples(request.sample_map)
        return run_rounds(
            fed,
            setup.aggregator,
            setup.initial_params,
            num_rounds=config.training.rounds,
            client_ids=[c for c in fed.client_ids if c not in request.forget],
            sampler=sampler_of(config),
        )
    finally:
        setup.close()


def first_use(session: UnlearnSession, config: RunConfig, request: UnlearnRequest) -> int | None:
    """The first round that drew a forgotten client or used a deleted sample, from the store."""
    store = session.run_view.store
    for round_ in range(1, config.training.rounds + 1):
        for record in store.client_records(round_):
            c = record.client_id
            if c in request.forget:
                return round_
            wanted = request.sample_map.get(c)
            if wanted:
                ids = np.arange(session.run_view.client_sizes[c])
                local = derive_seed(config.seed, "client", round_, c, 0)
                drawn = np.concatenate(step_batches(local, ids, BATCH, STEPS))
                if np.isin(ids[drawn], sorted(wanted)).any():
                    return round_
    return None


def requests_of(seed: int, sizes: dict[int, int]) -> list[tuple[str, UnlearnRequest]]:
    """The seed's three requests (random clients and samples, from the seed)."""
    rng = np.random.default_rng(seed + 10_000)
    clients = sorted(sizes)
    owner = int(rng.choice(clients))
    samples = sorted(int(i) for i in rng.choice(sizes[owner], 2, replace=False))
    return [
        (KINDS[0], UnlearnRequest.of([int(rng.choice(clients))])),
        (KINDS[1], UnlearnRequest.of([], samples={owner: samples})),
        (KINDS[2], UnlearnRequest.of(sorted(int(c) for c in rng.choice(clients, 3, False)))),
    ]


def predicted(config: RunConfig, sizes: dict[int, int], request: UnlearnRequest) -> float:
    """The planner's P(recompute) for ``request`` on ``config``."""
    inputs = PlanInputs.from_config(config, [sizes[c] for c in sorted(sizes)])
    if request.samples:
        ((owner, ids),) = request.samples
        cost = sample_request(inputs, owner, len(ids))
    else:
        cost = client_request(inputs, len(request.forget))
    return float(cost.recompute_probability or 0.0)


def run_seed(seed: int, work: Path) -> list[dict[str, Any]]:
    """Train, unlearn the three requests, compare with scratch; one row per request."""
    config = config_of(seed)
    path = work / f"run{seed}"
    train_run(config, path)
    rows = []
    try:
        with UnlearnSession(path, evaluate=False) as session:
            sizes = dict(session.run_view.client_sizes)
            for kind, request in requests_of(seed, sizes):
                result = session.run(make_method("tv_exact"), request)
                first = first_use(session, config, request)
                rows.append(
                    {
                        "seed": seed,
                        "kind": kind,
                        "clients": config.data.num_clients,
                        "bitwise_equal": bool(torch.equal(result.params, scratch(config, request))),
                        "recomputed_from": result.details.recomputed_from_round,
                        "first_use": first,
                        "predicted_p": predicted(config, sizes, request),
                    }
                )
    finally:
        shutil.rmtree(path, ignore_errors=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per request kind, mismatches and nothing-recomputed vs the planner."""
    lines = [
        "| request | runs | bitwise mismatches | first round != first use | nothing recomputed "
        "| planner: nothing recomputed | z |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind in KINDS:
        mine = [r for r in rows if r["kind"] == kind]
        n = len(mine)
        mismatches = sum(not r["bitwise_equal"] for r in mine)
        wrong_round = sum(r["recomputed_from"] != r["first_use"] for r in mine)
        nothing = sum(r["recomputed_from"] is None for r in mine)
        expected = sum(1 - r["predicted_p"] for r in mine)
        var = sum(r["predicted_p"] * (1 - r["predicted_p"]) for r in mine)
        z = (nothing - expected) / math.sqrt(var) if var else 0.0
        lines.append(
            f"| {kind} | {n} | {mismatches} | {wrong_round} | {nothing} ({nothing / n:.1%}) | "
            f"{expected:.1f} ({expected / n:.1%}) | {z:+.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=200, help="runs (seeds 0..N-1)")
    parser.add_argument("--json", type=Path, default=None, help="also write every row here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.time()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fedunlearn-exactness-") as work:
        for seed in range(args.seeds):
            rows.extend(run_seed(seed, Path(work)))
    wall = time.time() - start
    print(table(rows))
    print(
        f"\n{args.seeds} seeds x {len(KINDS)} requests, {wall:.0f} s wall; "
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch thread, "
        f"torch {torch.__version__}, {datetime.now(UTC):%Y-%m-%d}"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    if any(not r["bitwise_equal"] or r["recomputed_from"] != r["first_use"] for r in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
