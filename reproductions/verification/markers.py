"""Participation markers on the digits quickstart: power and utility cost (issue 21, item 4).

For each seed the quickstart (10 clients; two seeded attackers plant a backdoor: 1 and 3 on
seed 0) is trained twice: without markers, and with a marker (``verification.markers``:
``--samples`` marked copies, ``--pixels``-pixel secret pattern) on the honest clients
``--honest`` and on the seed's two attackers. It prints

- the utility cost: the final test accuracy (and the backdoor ASR) with and without markers;
- the power, per request (each marked honest client alone; both attackers together): the
  marker rate (share of marked probe inputs classified as the client's target) on
  the original and on Retrain, the mean rate of 4 never-embedded decoy patterns on each, and
  the receipt's markers verdict for the original + noise (std 1e-3) and for Retrain's
  parameters audited without a lineage (the check alone decides), with Retrain as reference.

One torch thread.

    nice -n 10 python reproductions/verification/markers.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from fedunlearn.config import load_config
from fedunlearn.eval import Verifier
from fedunlearn.fl.attacks import choose_malicious
from fedunlearn.fl.seeding import derive_seed
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

REPO = Path(__file__).resolve().parents[2]


def final_metrics(run: Path) -> dict[str, float]:
    """Return the final model's test accuracy and backdoor ASR."""
    with UnlearnSession(run, evaluate=False) as session:
        return session.evaluation.evaluate(session.run_view.final_params)


def power_rows(run: Path, requests: list[tuple[list[int], str]], seed: int) -> list[dict]:
    """Return, per request and marked client, the rates and the receipt's verdicts."""
    rows = []
    with UnlearnSession(run, evaluate=False) as session:
        for forget, kind in requests:
            request = UnlearnRequest.of(forget, kind)
            retrain = session.run(make_method("retrain"), request)
            verifier = Verifier(session, request, retrain=retrain, seed=seed)
            original = session.run_view.final_params
            g = torch.Generator().manual_seed(seed + 100)
            noisy = original + 1e-3 * torch.randn(original.shape, generator=g)
            verdict_noisy = verifier.audit(noisy, "noise")[1].check("markers").verdict
            verdict_retrain = verifier.audit(retrain.params, "retrain")[1].check("markers").verdict
            (m_o, d_o), (m_r, d_r) = (
                verifier.marker_probe.rates(original),
                verifier.marker_probe.rates(retrain.params),
            )
            for cid in sorted(m_o):
                rows.append(
                    {
                        "seed": seed,
                        "request": ",".join(map(str, forget)),
                        "client": cid,
                        "original": m_o[cid],
                        "original_decoy": d_o[cid],
                        "retrain": m_r[cid],
                        "retrain_decoy": d_r[cid],
                        "noisy_verdict": verdict_noisy,
                        "retrain_verdict": verdict_retrain,
                    }
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--honest", type=int, nargs="+", default=[0, 2], help="honest clients to mark"
    )
    parser.add_argument(
        "--no-attackers", action="store_true", help="do not mark the seed's attackers"
    )
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--pixels", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    utility, power = [], []
    with tempfile.TemporaryDirectory(prefix="markers-") as tmp:
        for seed in args.seeds:
            plain, marked = Path(tmp) / f"plain{seed}", Path(tmp) / f"marked{seed}"
            train_run(load_config(REPO / "configs/digits_quickstart.yaml", {"seed": seed}), plain)
            attackers = sorted(
                choose_malicious(10, 2, derive_seed(seed, "attack", 0))
            )  # the quickstart's attackers on this seed
            clients = [c for c in args.honest if c not in attackers]
            if not args.no_attackers:
                clients += attackers
            spec = {"clients": clients, "samples": args.samples, "pixels": args.pixels}
            config = load_config(
                REPO / "configs/digits_quickstart.yaml",
                {"seed": seed, "verification": {"markers": spec}},
            )
            train_run(config, marked)
            utility.append((seed, final_metrics(plain), final_metrics(marked)))
            requests = [([c], "forget") for c in clients if c not in attackers]
            if not args.no_attackers:
                requests.append((attackers, "recover"))
            power += power_rows(marked, requests, seed)
    print(
        "| seed | test accuracy without markers | with markers | change (points) | "
        "backdoor ASR without / with |"
    )
    print("|---|---|---|---|---|")
    nan = float("nan")
    for seed, a, b in utility:
        print(
            f"| {seed} | {a['test_accuracy']:.4f} | {b['test_accuracy']:.4f} | "
            f"{100 * (b['test_accuracy'] - a['test_accuracy']):+.1f} | "
            f"{a.get('backdoor_asr', nan):.3f} / {b.get('backdoor_asr', nan):.3f} |"
        )
    print()
    print(
        "| seed | request | client | marker rate: original | Retrain | decoys: original | "
        "Retrain | original + noise | Retrain (audited) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in power:
        print(
            f"| {r['seed']} | {r['request']} | {r['client']} | {r['original']:.3f} | "
            f"{r['retrain']:.3f} | {r['original_decoy']:.3f} | {r['retrain_decoy']:.3f} | "
            f"{r['noisy_verdict']} | {r['retrain_verdict']} |"
        )
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
