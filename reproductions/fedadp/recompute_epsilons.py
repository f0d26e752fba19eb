"""Recompute every stated ε of the DP examples with dp-accounting, apart from fedunlearn's.

Each figure is built here from its inputs (client sample counts, B, E, T, ε_max, δ; a run's
stored σ_t, q and steps) with ``dp_accounting`` called directly (events, RDP calibration of σ
at ε_max, PLD at both neighbour relations), then compared with what fedunlearn states (its
ledger functions; a run's ``privacy.json``) and with the figures the docs print (``DOCUMENTED``):

- ``example``: ``configs/digits_fedadp.yaml``, a priori (every round at ε_max), at replace-one
  (the guarantee: every upload carries n_c) and add/remove (beside it), for T = 6 and T = 30;
- ``lifecycle``: docs/privacy.md's living run: 6 rounds, a DP Retrain forgetting client 0
  (6 rounds at ε_max over clients 1-9), 2 continued rounds over clients 1-9, composed;
- ``runs`` (``--runs DIR ...``): each run's realised totals from its stored σ_t, q, steps
  (both relations) and its a-priori guarantee, against the run's ``privacy.json`` (whose rows
  are checked against the store's round scalars); ``--first N`` adds each run's first N rounds
  composed on their own. The release's fresh ε of ``lifecycle`` is compared with what
  ``fedunlearn apply`` recomputes for it (``fedunlearn.privacy.releases.release_epsilon``).

Prints one row per figure; exits 1 if one disagrees (relative 1e-3 with fedunlearn, 0.005 with
a documented two-decimal figure, which must also appear in docs/privacy.md):

    python reproductions/fedadp/recompute_epsilons.py               # the config's figures
    python reproductions/fedadp/recompute_epsilons.py --runs runs/fedadp_seed0 --first 6

Paper: FedADP (Jiang et al.) Eq. 4-6 (per-round ε_t only); the accounting: docs/privacy.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dp_accounting
from dp_accounting import pld, rdp

from fedunlearn.config import RunConfig, load_config
from fedunlearn.history.store import HistoryStore
from fedunlearn.privacy.guarantees import upfront_totals
from fedunlearn.privacy.releases import DPRelease, release_epsilon
from fedunlearn.runs.setup import build_setup

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "configs" / "digits_fedadp.yaml"
#: The page that prints the documented figures (each must appear there, two decimals).
DOCS = ROOT / "docs" / "privacy.md"
#: The RDP orders fedunlearn states it calibrates with (docs/privacy.md): 2.0-10.9, 11-63, 128-512.
ORDERS = [1 + x / 10.0 for x in range(10, 100)] + list(range(11, 64)) + [128, 256, 512]
REPLACE = dp_accounting.NeighboringRelation.REPLACE_ONE
ADD_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
#: The figures docs/privacy.md prints, two decimals (each is looked for in its text).
DOCUMENTED = {
    "example T=30 a priori, replace-one": 31.70,
    "example T=30 a priori, add/remove": 15.22,
    "example T=6 a priori, replace-one": 11.17,
    "example T=6 a priori, add/remove": 6.15,
    "lifecycle: 8 trained rounds a priori, replace-one": 13.33,
    "lifecycle: DP Retrain release, replace-one": 11.17,
    "lifecycle: guarantee with the release": 24.50,
}


def sampled(sigma: float, q: float, steps: int, rounds: int = 1) -> dp_accounting.DpEvent:
    """``rounds`` rounds of ``steps`` Poisson-sampled Gaussian steps."""
    step = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    return dp_accounting.SelfComposedDpEvent(step, steps * rounds)


def pld_eps(events: Sequence[dp_accounting.DpEvent], delta: float, relation: Any) -> float:
    acc = pld.PLDAccountant(value_discretization_interval=1e-3, neighboring_relation=relation)
    return float(acc.compose(dp_accounting.ComposedDpEvent(list(events))).get_epsilon(delta))


def sigma_at(q: float, steps: int, epsilon: float, delta: float) -> float:
    """σ for which one round costs ε at δ by RDP (add/remove): the calibration ε_t is set in."""
    return float(
        dp_accounting.calibrate_dp_mechanism(
            lambda: rdp.RdpAccountant(ORDERS),
            lambda s: sampled(s, q, steps),
            epsilon,
            delta,
            dp_accounting.LowerEndpointAndGuess(1e-2, 1.0),
            tol=1e-7,
        )
    )


def round_event(sizes: Sequence[int], batch: int, epochs: int) -> tuple[float, int]:
    """The accounted event of a round: the largest q = B/n_c and the most ceil(E n_c/B) steps."""
    q = max(min(1.0, batch / n) for n in sizes)
    steps = max(epochs if n <= batch else math.ceil(epochs * n / batch) for n in sizes)
    return q, steps


def example_rows(config: RunConfig, sizes: dict[int, int]) -> list[dict[str, Any]]:
    """The example config's a-priori figures, and the lifecycle example's."""
    p, t = config.privacy, config.training
    eps_max, delta = p.budget.epsilon_max, p.delta
    q, steps = round_event(list(sizes.values()), t.batch_size, t.local_epochs)
    sigma = sigma_at(q, steps, eps_max, delta)
    rows = []
    for rounds in (30, 6):
        stated = upfront_totals(
            p, [{"sample_rate": q, "steps": steps, "epsilon": eps_max}] * rounds
        )
        for relation, name, ours in (
            (REPLACE, "replace-one", stated["pld_epsilon"]),
            (ADD_REMOVE, "add/remove", stated["add_remove_pld_epsilon"]),
        ):
            direct = pld_eps([sampled(sigma, q, steps, rounds)], delta, relation)
            rows.append(_row(f"example T={rounds} a priori, {name}", direct, ours))
    # the living run: rounds 1-6 over every client, the release and rounds 7-8 over clients 1-9
    q9, steps9 = round_event([n for c, n in sizes.items() if c != 0], t.batch_size, t.local_epochs)
    sigma9 = sigma_at(q9, steps9, eps_max, delta)
    trained = [sampled(sigma, q, steps, 6), sampled(sigma9, q9, steps9, 2)]
    run_eps = pld_eps(trained, delta, REPLACE)
    release = pld_eps([sampled(sigma9, q9, steps9, 6)], delta, REPLACE)
    # what `fedunlearn apply` recomputes for a DP Retrain forgetting client 0 after 6 rounds
    applied = release_epsilon(
        config,
        DPRelease(rounds="run"),
        sizes={c: n for c, n in sizes.items() if c != 0},
        rounds=6,
        clip_norm=None,
    )
    stated = upfront_totals(
        p,
        [{"sample_rate": q, "steps": steps, "epsilon": eps_max}] * 6
        + [{"sample_rate": q9, "steps": steps9, "epsilon": eps_max}] * 2,
    )
    rows.append(
        _row("lifecycle: 8 trained rounds a priori, replace-one", run_eps, stated["pld_epsilon"])
    )
    rows.append(_row("lifecycle: DP Retrain release, replace-one", release, applied))
    rows.append(
        _row(
            "lifecycle: guarantee with the release",
            run_eps + release,
            None if applied is None else stated["pld_epsilon"] + applied,
        )
    )
    return rows


def run_rows(run_dir: Path, first: int | None = None) -> list[dict[str, Any]]:
    """A run's realised totals and a-priori guarantee, against its privacy.json and store.

    ``first``: only the run's first rounds, composed here (privacy.json states all of them, so
    there is nothing of fedunlearn's to compare them with).

    ``dp_sgd``: each round's stored (σ_t, q, steps); ``client_update``: one Gaussian release of
    ζ_t per round (std / S; replace one client's data: sensitivity 2S, as dp-accounting's
    REPLACE_ONE models it). The a-priori guarantee recalibrates σ (or scales ζ) to ε_max.
    """
    stated = json.loads((run_dir / "privacy.json").read_text())
    delta, eps_max = stated["delta"], stated["epsilon_bounds"][1]
    with HistoryStore.open(run_dir / "history") as store:  # the ledger is the store's scalars
        stored = [store.round_scalars(r) for r in range(1, (store.last_round() or 0) + 1)]
    live = [row for row in stated["rounds"] if not row.get("replaced_by_generation")]
    assert [row["noise_multiplier"] for row in live] == [
        sc["dp_noise_multiplier"] for sc in stored if "dp_noise_multiplier" in sc
    ], f"{run_dir}: privacy.json's rows are not the store's"
    events, upfront = [], []
    for row in stated["rounds"][:first]:
        if stated["mechanism"] == "dp_sgd":
            sigma, q, steps = row["noise_multiplier"], row["sample_rate"], row["steps"]
            events.append(sampled(sigma, q, steps))
            upfront.append(sampled(sigma_at(q, steps, eps_max, delta), q, steps))
        else:
            zeta = row["noise_multiplier"]
            events.append(dp_accounting.GaussianDpEvent(zeta))
            upfront.append(dp_accounting.GaussianDpEvent(zeta * row["epsilon"] / eps_max))
    name = run_dir.name if first is None else f"{run_dir.name} rounds 1-{first}"
    whole = first is None
    return [
        _row(
            f"{name}: realised, replace-one",
            pld_eps(events, delta, REPLACE),
            stated["realised_epsilon"] if whole else None,
        ),
        _row(
            f"{name}: realised, add/remove",
            pld_eps(events, delta, ADD_REMOVE),
            stated["totals"]["add_remove_one"]["pld_epsilon"] if whole else None,
        ),
        _row(
            f"{name}: a priori, replace-one",
            pld_eps(upfront, delta, REPLACE),
            stated["epsilon_guarantee"]["pld_epsilon"] if whole else None,
        ),
    ]


def _row(name: str, direct: float | None, stated: float | None) -> dict[str, Any]:
    documented = DOCUMENTED.get(name)
    ok = True
    if direct is not None and stated is not None:
        ok = abs(direct - stated) <= 1e-3 * max(1.0, abs(direct))
    if documented is not None and direct is not None:
        ok = ok and abs(round(direct, 2) - documented) <= 0.005
        ok = ok and f"{documented:.2f}" in DOCS.read_text(encoding="utf-8")
    return {
        "figure": name,
        "dp_accounting": direct,
        "fedunlearn": stated,
        "documented": documented,
        "ok": ok,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Recompute, print the table (or JSON), return 1 if a figure disagrees."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=EXAMPLE)
    parser.add_argument("--runs", type=Path, nargs="*", default=[])
    parser.add_argument(
        "--first", type=int, default=None, help="also each run's first N rounds on their own"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    setup = build_setup(config)
    try:
        sizes = {c: setup.federation.num_samples(c) for c in setup.federation.client_ids}
    finally:
        setup.close()
    rows = example_rows(config, sizes)
    for run_dir in args.runs:
        rows += run_rows(run_dir)
        if args.first is not None:
            rows += run_rows(run_dir, args.first)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print("| figure | dp-accounting | fedunlearn | documented | agrees |")
        print("|---|---|---|---|---|")
        for r in rows:
            cells = [
                f"{r[k]:.3f}" if isinstance(r[k], float) else "–"
                for k in ("dp_accounting", "fedunlearn", "documented")
            ]
            print(f"| {r['figure']} | {' | '.join(cells)} | {'yes' if r['ok'] else 'NO'} |")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
