"""Is the client-level test's `remains` for off-path approximate methods right? (issue 21).

On the digits quickstart, recovering from the seed's two attackers, the client-level
membership test flags the models of Crab, FedRecover, FedADP, random rounds and Starfish
(`remains`) although their backdoor ASR is at Retrain's. This script puts each method's
client-level score beside what the other evidence says about the same model: its backdoor ASR,
its relative distance to Retrain, its rate for the attackers' participation markers (the run is
trained with markers on both attackers: ``verification.markers``) against Retrain's, and the
scores of *clean off-path* models that never saw the attackers but left Retrain's path in other
ways: Retrain with half the rounds and two independent exact retrains (other batch orders).
Each row also shows where the model's fitness (its mean logit confidence on the remaining
clients' examples) lies against the test's reference models (``below``, ``within``, ``above``:
the test judges only models within) and its share of the way from Retrain to the original
(``toward``: 0 at Retrain, 1 at the original; the distance check warns above the exact
retrains' line).

    nice -n 10 python reproductions/verification/off_path.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from fedunlearn.config import load_config
from fedunlearn.eval import Verifier, client_membership_check
from fedunlearn.eval.distance import l2_distance
from fedunlearn.eval.distance_band import independent_retrains
from fedunlearn.eval.mia.client_lira import (
    _Budget,
    _run_participants,
    _SaltedClients,
    _train_reference,
)
from fedunlearn.fl.attacks import choose_malicious
from fedunlearn.fl.seeding import derive_seed
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

REPO = Path(__file__).resolve().parents[2]
METHODS = ("crab", "fedrecover", "fedadp", "random", "starfish", "federaser")


def half_rounds_retrain(session: UnlearnSession, request: UnlearnRequest) -> torch.Tensor:
    """Return Retrain stopped after half the run's rounds (a less-trained clean model)."""
    rounds = _run_participants(session)
    trained = _train_reference(
        _SaltedClients(session.federation, 0),
        session.run_view.initial_params,
        rounds[: len(rounds) // 2],
        session.context(request).aggregator,
        frozenset(request.forget),
        _Budget(1e9),
    )
    assert trained is not None
    return trained[0].to(torch.float32)


def rows_of(run: Path, attackers: list[int], seed: int) -> list[dict]:
    """Return one row per judged model of the attackers' recovery request."""
    request = UnlearnRequest.of(attackers, "recover")
    rows = []
    with UnlearnSession(run, evaluate=False) as session:
        retrain = session.run(make_method("retrain"), request)
        membership = client_membership_check(session, request, retrain, seed=seed)
        verifier = Verifier(
            session, request, retrain=retrain, seed=seed, client_membership=membership
        )
        gap = l2_distance(session.run_view.final_params, retrain.params)
        others, _ = independent_retrains(session, request, 2, seed=seed + 50)
        models = {
            "retrain": retrain.params,
            "clean: independent retrain 1": others[0],
            "clean: independent retrain 2": others[1],
            "clean: retrain, half the rounds": half_rounds_retrain(session, request),
            "original": session.run_view.final_params,
        }
        results = {}
        for name in METHODS:
            started = time.perf_counter()
            results[name] = session.run(make_method(name), request)
            results[name] = (results[name], time.perf_counter() - started)
        for label, params in list(models.items()) + [
            (name, r.params) for name, (r, _) in results.items()
        ]:
            row, receipt = verifier.audit(params, label)
            cm = receipt.check("client_membership")
            marks = receipt.check("markers")
            rows.append(
                {
                    "seed": seed,
                    "model": label,
                    "asr": row.get("backdoor_asr"),
                    "relative": l2_distance(params, retrain.params) / gap,
                    "score": cm.value,
                    "line": cm.threshold.get("fail"),
                    "calibrated": cm.threshold.get("calibrated"),
                    "continued": (cm.reference or {}).get("retrain_continued"),
                    "client_membership": cm.verdict,
                    "region": cm.evidence.get("region", "-"),
                    "toward": receipt.check("distance").evidence.get("toward_original"),
                    "distance": receipt.check("distance").verdict,
                    "markers": marks.verdict,
                    "marker_rate": marks.value,
                    "influence": receipt.influence,
                    "accuracy": row.get("test_accuracy"),
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="off-path-") as tmp:
        for seed in args.seeds:
            base = load_config(REPO / "configs/digits_quickstart.yaml", {"seed": seed})
            attackers = sorted(
                choose_malicious(
                    base.data.num_clients, base.attack.num_malicious, derive_seed(seed, "attack", 0)
                )
            )
            config = load_config(
                REPO / "configs/digits_quickstart.yaml",
                {"seed": seed, "verification": {"markers": {"clients": attackers}}},
            )
            run = Path(tmp) / f"seed{seed}"
            train_run(config, run)
            rows += rows_of(run, attackers, seed)
    print(
        "| seed | model | backdoor ASR | test acc | distance (x o) | client-level score "
        "(flag line; calibrated threshold) | fitness | client-level | toward | distance | "
        "marker rate (worst attacker) | markers | influence |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['seed']} | {r['model']} | {100 * r['asr']:.1f}% | {100 * r['accuracy']:.1f}% | "
            f"{r['relative']:.2f} | {r['score']:.0f} ({r['line']:.0f}; {r['calibrated']:.0f}) | "
            f"{r['region']} | {r['client_membership']} | {r['toward']:.2f} | {r['distance']} | "
            f"{100 * r['marker_rate']:.1f}% | {r['markers']} | "
            f"{r['influence']} |"
        )


if __name__ == "__main__":
    main()
