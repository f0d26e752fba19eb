r"""Measure the client-level membership test on the digits quickstart (docs/verification.md).

For each seed this trains ``configs/digits_quickstart.yaml`` (the seed overridden; client 0 is
honest, clients 1 and 3 attack), computes the exact Retrain without client 0, and runs
``measure_client_membership`` forgetting client 0 on: the original (negative control), Retrain
(positive control), the original + Gaussian noise (std 1e-6 and 1e-3), the original fine-tuned
for 200 epochs on client 0's data alone, and Retrain fine-tuned on client 0's data for one
round's local training (2 epochs), interpolations of the original with Retrain, and the results
of a few approximate unlearning methods (``--methods``). It prints every score, the threshold,
the power at ``--fpr``, which models are flagged, and the cost (seconds, client epochs) next to
Retrain's.

Usage (about 15 seconds per seed on 2 busy cores, plus 8 s to train each run)::

    nice -n 5 python reproductions/verification/client_lira.py --seeds 0,1,2 --out runs/lira

Re-running with the same ``--out`` reuses the trained runs.
"""

from __future__ import annotations

import argparse
import platform
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import torch

from fedunlearn.config import load_config
from fedunlearn.eval.mia import measure_client_membership
from fedunlearn.fl.client import local_update
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "digits_quickstart.yaml"
FORGET = 0


def _train(seed: int, out: Path) -> Path:
    run = out / f"quickstart_s{seed}"
    if not (run / "config.yaml").exists():
        train_run(load_config(CONFIG, {"seed": seed}), run)
    return run


def _fine_tune(session: UnlearnSession, start: torch.Tensor, epochs: int) -> torch.Tensor:
    federation = session.federation
    spec = replace(federation.spec, epochs=epochs)
    update = local_update(federation.model, start, federation.client_data[FORGET], spec, seed=12345)
    return start + update.delta


def measure(run: Path, seed: int, args: argparse.Namespace) -> dict[str, bool]:
    """Print one seed's scores, threshold, power and cost; return which models are flagged."""
    request = UnlearnRequest.of([FORGET])
    with UnlearnSession(run, evaluate=False) as session:
        original = session.run_view.final_params
        start = time.perf_counter()
        retrain = session.run(make_method("retrain"), request)
        retrain_seconds = time.perf_counter() - start
        noise = torch.Generator().manual_seed(seed)
        models = {
            "original": original,
            "retrain": retrain.params,
            "original+1e-6": original + 1e-6 * torch.randn(original.shape, generator=noise),
            "original+1e-3": original + 1e-3 * torch.randn(original.shape, generator=noise),
            "finetuned_200ep": _fine_tune(session, original, 200),
            "retrain+client0_2ep": _fine_tune(session, retrain.params, 2),
            "interp_0.5": 0.5 * original + 0.5 * retrain.params,
            "interp_0.1": 0.1 * original + 0.9 * retrain.params,
        }
        for method in filter(None, args.methods.split(",")):
            models[method] = session.run(make_method(method), request).params
        evidence = measure_client_membership(
            session,
            [FORGET],
            models,
            num_reference=args.num_reference,
            target_fpr=args.fpr,
            seed=seed,
        )
    print(
        f"seed {seed}: threshold {evidence.threshold:.4f} at FPR {evidence.target_fpr}, "
        f"power {evidence.power:.2f} ({evidence.notes['num_in']} in / "
        f"{evidence.notes['num_out']} out references)"
    )
    loo = evidence.notes["reference_scores"]
    print(
        "  reference scores (leave-one-out): in "
        + ", ".join(f"{s:.4f}" for s in loo["in"])
        + "; out "
        + ", ".join(f"{s:.4f}" for s in loo["out"])
    )
    flagged = {}
    for label, score in evidence.scores.items():
        flagged[label] = evidence.flagged(label)
        print(f"  {label:22s} score {score:9.4f}  {'FLAGGED' if flagged[label] else 'not flagged'}")
    print(
        f"  cost: {evidence.cost_seconds:.1f} s, {evidence.cost_client_epochs:.0f} client "
        f"epochs; Retrain: {retrain_seconds:.1f} s, {retrain.costs.client_epochs:.0f} client "
        "epochs"
    )
    return flagged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", type=Path, default=Path("runs/lira"))
    parser.add_argument("--num-reference", type=int, default=8)
    parser.add_argument("--fpr", type=float, default=0.05)
    parser.add_argument(
        "--methods", default="federaser,fedrecover", help="unlearning methods to score too"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}"
    )
    for seed in [int(s) for s in args.seeds.split(",")]:
        measure(_train(seed, args.out), seed, args)


if __name__ == "__main__":
    main()
