"""The distance check's band from independent exact retrains, on the digits quickstart (issue 21).

For each seed the quickstart is trained and, for two requests (forgetting honest client 0;
recovering from the seed's two attackers), ``--count`` + 2 independent exact retrains are
trained (Retrain with other batch orders: ``fedunlearn.eval.distance_band``). It prints the
retrains' relative distances ``||r_i - r|| / ||o - r||`` to Retrain, the band from the first
``--count`` of them (95% Student-t prediction bound), whether the 2 held-out retrains land inside
it (a false-fail check of the band), and the relative distance of the original plus noise
(std 1e-3, 1e-2) and of the half-way interpolation, with the distance check's verdict from a
receipt with that band.

    nice -n 10 python reproductions/verification/distance_band.py --seeds 0 1 2 --count 4
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from fedunlearn.config import load_config
from fedunlearn.eval import Verifier
from fedunlearn.eval.distance import l2_distance
from fedunlearn.eval.distance_band import DistanceBand, independent_retrains
from fedunlearn.fl.attacks import choose_malicious
from fedunlearn.fl.seeding import derive_seed
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

REPO = Path(__file__).resolve().parents[2]


def rows_of(run: Path, forget: list[int], kind: str, count: int, seed: int) -> dict:
    """Return the band, the held-out retrains and the contaminated models' verdicts."""
    request = UnlearnRequest.of(forget, kind)
    with UnlearnSession(run, evaluate=False) as session:
        retrain = session.run(make_method("retrain"), request)
        started = time.perf_counter()
        models, epochs = independent_retrains(session, request, count + 2, seed=seed)
        seconds = time.perf_counter() - started
        original = session.run_view.final_params
        gap = l2_distance(original, retrain.params)
        relative = [l2_distance(m, retrain.params) / gap for m in models]
        band = DistanceBand(tuple(relative[:count]), seconds, epochs)
        verifier = Verifier(session, request, retrain=retrain, distance_band=band, seed=seed)
        g = torch.Generator().manual_seed(seed + 7)
        judged = {
            **{f"held-out retrain {i + 1}": m for i, m in enumerate(models[count:])},
            "original + 1e-3": original + 1e-3 * torch.randn(original.shape, generator=g),
            "original + 1e-2": original + 1e-2 * torch.randn(original.shape, generator=g),
            "interp 0.5": 0.5 * original + 0.5 * retrain.params,
        }
        verdicts = {}
        for label, params in judged.items():
            check = verifier.audit(params, label)[1].check("distance")
            verdicts[label] = (check.value, check.verdict)
    return {"relative": relative, "band": band, "verdicts": verdicts, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--count", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        "| seed | request | retrains (relative) | band | held-out retrains | o + 1e-3 | "
        "o + 1e-2 | interp 0.5 | retrains' wall s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="distance-band-") as tmp:
        for seed in args.seeds:
            run = Path(tmp) / f"seed{seed}"
            config = load_config(REPO / "configs/digits_quickstart.yaml", {"seed": seed})
            train_run(config, run)
            attackers = sorted(
                choose_malicious(
                    config.data.num_clients,
                    config.attack.num_malicious,
                    derive_seed(seed, "attack", 0),
                )
            )
            for name, forget, kind in (
                ("honest 0", [0], "forget"),
                (f"attackers {attackers}", attackers, "recover"),
            ):
                out = rows_of(run, forget, kind, args.count, seed)
                v = out["verdicts"]

                def cell(label: str, v: dict = v) -> str:
                    value, verdict = v[label]
                    return f"{value:.2f} {verdict}"

                held = ", ".join(cell(k) for k in v if k.startswith("held-out"))
                shown = ", ".join(f"{x:.2f}" for x in out["relative"][: args.count])
                print(
                    f"| {seed} | {name} | {shown} | {out['band'].band:.2f} | {held} | "
                    f"{cell('original + 1e-3')} | {cell('original + 1e-2')} | "
                    f"{cell('interp 0.5')} | {out['seconds']:.1f} |"
                )


if __name__ == "__main__":
    main()
