"""Starfish on a small convex run: sigma against Retrain, and the fixed-point headroom (SF21).

Trains one run (L2-regularised logistic regression on 3-class Gaussian blobs, 6 Dirichlet-0.5
clients, T = 12 rounds, 2 local epochs, lr 0.05, weight decay 1e-3; the run of the Starfish
tests), removes clients 0 and 1, and prints three tables:

1. distance to Retrain relative to the original model's (1.0 = no better than not unlearning)
   and client epochs, for Starfish at sigma 0.6 / 0.8 / 1.0, FedRecover, FedEraser and random
   round selection (fraction 0.6);
2. the plaintext mirror with every secret rounded to 2^-f (the encoding alone, no truncation
   or SecMI error), f = 13 and 16, in both update units: same selected rounds, same correction
   flags, relative model error against the float64 mirror;
3. the 2PC backend (two servers in threads) at f = 13 and 16 against the float64 mirror.

    nice -n 10 python reproductions/starfish/small_run.py [--out runs/starfish_small]

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Theorem 1 (sigma), App. B (fixed point, 13 fractional bits). Deviations SF21 and the sigma
observation: docs/methods/starfish.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from fedunlearn.config import parse_config
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnResult, UnlearnSession, make_method
from fedunlearn.unlearn.starfish import Starfish
from fedunlearn.unlearn.starfish.backend.plain import PlainBackend, PlainSecret

RUN = {
    "seed": 5,
    "data": {
        "dataset": "synthetic",
        "num_clients": 6,
        "partition": "dirichlet",
        "alpha": 0.5,
        "options": {"num_samples": 600, "num_features": 12, "num_classes": 3},
    },
    "model": {"name": "logreg"},
    "training": {
        "rounds": 12,
        "local_epochs": 2,
        "lr": 0.05,
        "batch_size": 40,
        "weight_decay": 1e-3,
        "executor": "serial",
    },
    "history": {"policy": "all"},
}
FORGET = UnlearnRequest.of([0, 1])
METHODS: list[tuple[str, str, dict[str, Any]]] = [
    ("Starfish, sigma = 0.6 (default)", "starfish", {}),
    ("Starfish, sigma = 0.8", "starfish", {"selection_rate": 0.8}),
    ("Starfish, sigma = 1.0", "starfish", {"selection_rate": 1.0}),
    ("FedRecover (defaults)", "fedrecover", {}),
    ("FedEraser (defaults)", "federaser", {}),
    ("random rounds, fraction 0.6", "random", {"fraction": 0.6}),
]


class RoundedStarfish(Starfish):
    """The plaintext mirror with every secret rounded to ``frac_bits`` fractional bits."""

    def __init__(self, frac_bits: int, options: dict[str, Any]) -> None:
        super().__init__(options)
        self.scale_bits = 2.0**frac_bits

    def make_backend(self, context: Any) -> PlainBackend:
        """Return the mirror whose every secret is rounded to 2^-f."""
        scale = self.scale_bits

        class Rounded(PlainBackend):
            def _wrap(self, value: torch.Tensor) -> PlainSecret:
                return PlainSecret(torch.round(value * scale) / scale)

        return Rounded(dtype=self.working_dtype(context))


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b||."""
    return float((a - b).norm() / b.norm())


def compare(result: UnlearnResult, reference: UnlearnResult) -> str:
    """Same rounds, same flags, relative model error of ``result`` against ``reference``."""
    same_rounds = result.details.selected_rounds == reference.details.selected_rounds
    same_flags = result.details.flags == reference.details.flags
    error = relative(result.params, reference.params)
    return f"| {same_rounds} | {same_flags} | {error:.1e} |"


def main() -> None:
    """Train the run, unlearn, print the three tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/starfish_small"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    run_dir = args.out / "run"
    if not (run_dir / "history").exists():
        train_run(parse_config(RUN), run_dir)
    with UnlearnSession(run_dir, evaluate=False) as session:
        retrain = session.run(make_method("retrain"), FORGET)
        original = float((session.run_view.final_params - retrain.params).norm())
        print("| method | relative distance to Retrain | client epochs |")
        print("|---|---|---|")
        print(f"| Retrain | 0.00 | {retrain.costs.client_epochs} |")
        for label, name, params in METHODS:
            result = session.run(make_method(name, params), FORGET)
            gap = float((result.params - retrain.params).norm()) / original
            print(f"| {label} | {gap:.2f} | {result.costs.client_epochs} |")

        print("\n| units | sigma | f | same rounds | same flags | relative model error |")
        print("|---|---|---|---|---|---|")
        for units in ("gradient", "delta"):
            for sigma in (0.6, 1.0):
                options = {"units": units, "selection_rate": sigma}
                mirror = session.run(make_method("starfish", options), FORGET)
                for bits in (13, 16):
                    rounded = session.run(RoundedStarfish(bits, options), FORGET)
                    print(f"| {units} | {sigma} | {bits} " + compare(rounded, mirror))

        print("\n| 2PC f | same rounds | same flags | relative model error |")
        print("|---|---|---|---|")
        mirror = session.run(make_method("starfish"), FORGET)
        for bits in (13, 16):
            options = {"backend": "mpc", "frac_bits": bits}
            secure = session.run(make_method("starfish", options), FORGET)
            print(f"| {bits} " + compare(secure, mirror))


if __name__ == "__main__":
    main()
