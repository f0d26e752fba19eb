"""Crab on the digits quickstart (configs/digits_crab.yaml): the default next to the paper's rule.

Trains the quickstart config (10 clients, 2 backdoored, 30 rounds, live ``history.policy:
crab``) for each seed, plus the late-join variant (the 2 attackers join at round 16, half the
clients per round), and prints one Markdown row per seed and variant: TA, backdoor ASR, client
epochs against Retrain, the rollback round and the warnings. Runs in about a minute.

    python reproductions/crab/quickstart.py --seeds 0 1 2 --out /tmp/crab_quickstart

Paper: Jiang et al., arXiv:2401.08216v2, Alg. 2 (``rollback: paper``); the defaults and their
deviations: docs/methods/crab.md.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

import yaml

from fedunlearn.config import parse_config
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "digits_crab.yaml"
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("crab (default)", {}),
    ("crab, final_rounds: 0", {"final_rounds": 0}),
    ("crab bounded", {"rollback": "bounded"}),
    ("crab paper", {"rollback": "paper", "rule": "literal", "final_rounds": 0}),
]
SCENARIOS = {
    "quickstart": {},
    "late join": {"attack": {"join_round": 16}, "training": {"participation": 0.5}},
}


def scenario_config(seed: int, changes: dict[str, Any]) -> Any:
    """Return the quickstart config with ``seed`` and the scenario's changes."""
    raw = yaml.safe_load(CONFIG.read_text())
    raw["seed"] = seed
    for section, values in changes.items():
        raw[section] = {**raw[section], **values}
    return parse_config(raw, f"{CONFIG.name} ({changes or 'as shipped'})")


def main() -> None:
    """Train and recover each seed and scenario; print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("/tmp/crab_quickstart"))
    args = parser.parse_args()
    print(
        "| scenario | seed | variant | TA % | ASR % | client epochs (x Retrain) | t_j* | "
        "first C_u round | warnings |\n|---|---|---|---|---|---|---|---|---|"
    )
    for name, changes in SCENARIOS.items():
        for seed in args.seeds:
            run_dir = args.out / name.replace(" ", "_") / f"seed{seed}"
            shutil.rmtree(run_dir, ignore_errors=True)
            summary = train_run(scenario_config(seed, changes), run_dir)
            poisoned = summary["final_metrics"]
            with UnlearnSession(run_dir, evaluate=False) as session:
                request = UnlearnRequest.of(sorted(session.run_view.malicious), "recover")
                retrain = session.run(make_method("retrain"), request)
                base = retrain.costs.client_epochs
                q = session.evaluation.evaluate(retrain.params)
                print(
                    f"| {name} | {seed} | poisoned | {100 * poisoned['test_accuracy']:.1f} | "
                    f"{100 * poisoned['backdoor_asr']:.1f} | – | – | – | – |"
                )
                print(
                    f"| {name} | {seed} | retrain | {100 * q['test_accuracy']:.1f} | "
                    f"{100 * q['backdoor_asr']:.1f} | {base} (1.00) | – | – | – |"
                )
                for label, params in VARIANTS:
                    result = session.run(make_method("crab", params), request)
                    q = session.evaluation.evaluate(result.params)
                    d = result.details
                    codes = ", ".join(sorted({w.split(":")[0] for w in d.warnings})) or "–"
                    epochs = result.costs.client_epochs
                    print(
                        f"| {name} | {seed} | {label} | {100 * q['test_accuracy']:.1f} | "
                        f"{100 * q['backdoor_asr']:.1f} | {epochs} ({epochs / base:.2f}) | "
                        f"{d.rollback_round} | {d.first_forgotten_round} | {codes} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
