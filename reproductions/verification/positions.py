"""Where clean and contaminated models lie for the receipt's two position measures (issue 21).

For one seed of a run config (default: the digits quickstart), and two requests (forgetting
honest client 0; recovering from the seed's two attackers), this prints per model:

- ``relative``: ``||u - r|| / ||o - r||`` (u the model, r Retrain, o the original);
- ``toward``: ``<u - r, o - r> / ||o - r||^2``, the model's position along the line from
  Retrain (0) to the original (1) (the distance check's warning, ``share_toward``);
- ``fitness``: its mean logit-scaled confidence on 2,000 of the remaining clients' training
  examples (the client-level test judges only models within its references' fitness range);
- ``score``: its client-level membership score (LiRA-style test, default options).

Models: 3 exact retrains and 3 originals with other batch orders (the kind of models the
client-level test's references are), Retrain stopped at half and three quarters of the rounds,
Retrain continued 5 rounds, the original and its noisy copies, the weight interpolations
``lambda o + (1 - lambda) r``, Retrain fine-tuned 20 epochs on the forgotten clients, and the
approximate methods (Crab, FedRecover, FedADP, random rounds, Starfish, FedEraser).

    nice -n 10 python reproductions/verification/positions.py --seed 0
    nice -n 10 python reproductions/verification/positions.py --seed 1 --threads 2 --config
        reproductions/verification/mnist_cnn_small.yaml --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from fedunlearn.config import load_config
from fedunlearn.eval.distance import l2_distance
from fedunlearn.eval.mia.client_lira import (
    _Budget,
    _run_participants,
    _SaltedClients,
    _train_reference,
    fit_client_membership,
    share_toward,
)
from fedunlearn.fl.attacks import choose_malicious
from fedunlearn.fl.client import local_update
from fedunlearn.fl.engine import run_rounds
from fedunlearn.fl.seeding import derive_seed
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

REPO = Path(__file__).resolve().parents[2]
METHODS = ("crab", "fedrecover", "fedadp", "random", "starfish", "federaser")


def _reference(session, request, rounds, excluded, salt):
    trained = _train_reference(
        _SaltedClients(session.federation, salt),
        session.run_view.initial_params,
        rounds,
        session.context(request).aggregator,
        excluded,
        _Budget(float("inf")),
    )
    assert trained is not None
    return trained[0].to(torch.float32)


def rows_of(session: UnlearnSession, forget: list[int], kind: str, seed: int) -> list[str]:
    request = UnlearnRequest.of(forget, kind)
    federation = session.federation
    original = session.run_view.final_params
    retrain = session.run(make_method("retrain"), request).params
    rounds = _run_participants(session)
    test = fit_client_membership(session, forget, seed=seed)
    out = frozenset(forget)
    models = {
        f"exact retrain {j}": _reference(session, request, rounds, out, 1000 + j) for j in range(3)
    }
    models |= {
        f"original, other batch orders {j}": _reference(
            session, request, rounds, frozenset(), 2000 + j
        )
        for j in range(3)
    }
    models["retrain, half the rounds"] = _reference(
        session, request, rounds[: len(rounds) // 2], out, 0
    )
    models["retrain, 3/4 of the rounds"] = _reference(
        session, request, rounds[: 3 * len(rounds) // 4], out, 0
    )
    context = session.context(request)
    last = session.run_view.num_rounds
    models["retrain + 5 rounds"] = run_rounds(
        context.clients,
        context.aggregator,
        retrain,
        num_rounds=last + 5,
        start_round=last + 1,
        participation=context.training.participation,
    )
    g = torch.Generator().manual_seed(seed)
    models["original"] = original
    for std in (1e-3, 1e-2):
        models[f"original + noise {std:g}"] = (
            original + torch.randn(original.shape, generator=g) * std
        )
    for lam in (0.75, 0.5, 0.25):
        models[f"interp {lam}"] = lam * original + (1 - lam) * retrain
    tuned = retrain.clone()
    for cid in forget:
        spec = replace(federation.spec, epochs=20)
        tuned = (
            tuned
            + local_update(
                federation.model, tuned, federation.client_data[cid], spec, seed=seed + cid
            ).delta
        )
    models["retrain fine-tuned on them"] = tuned
    for name in METHODS:
        models[name] = session.run(make_method(name), request).params
    models["retrain"] = retrain
    evidence = test.evidence({"original": original, **models})
    gap = l2_distance(original, retrain)
    lines = [
        f"\n{kind} {forget}: threshold {evidence.threshold:.4g}, fitness range "
        f"{evidence.domain[0]:.3f} to {evidence.domain[1]:.3f}"
        if evidence.domain
        else "",
        "| model | relative | toward | fitness | region | score |",
        "|---|---|---|---|---|---|",
    ]
    for label, params in models.items():
        fitness = evidence.fitness.get(label, float("nan"))
        lines.append(
            f"| {label} | {l2_distance(params, retrain) / gap:.3f} | "
            f"{share_toward(params, retrain, original):.3f} | {fitness:.3f} | "
            f"{evidence.region(label)} | {evidence.scores[label]:.4g} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", type=Path, default=REPO / "configs/digits_quickstart.yaml")
    parser.add_argument("--data-dir", help="data.data_dir (a folder with mnist.npz)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    overrides = {"seed": args.seed, **({"data.data_dir": args.data_dir} if args.data_dir else {})}
    config = load_config(args.config, overrides)
    attackers = sorted(
        choose_malicious(
            config.data.num_clients,
            config.attack.num_malicious,
            derive_seed(args.seed, "attack", 0),
        )
    )
    with tempfile.TemporaryDirectory(prefix="positions-") as tmp:
        train_run(config, Path(tmp) / "run")
        with UnlearnSession(Path(tmp) / "run", evaluate=False) as session:
            for forget, kind in (([0], "forget"), (attackers, "recover")):
                print("\n".join(rows_of(session, forget, kind, args.seed)))


if __name__ == "__main__":
    main()
