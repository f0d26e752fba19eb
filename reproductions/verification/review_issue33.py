"""Adversarial second opinion on the issue-33 verdicts, on seeds and settings never calibrated.

Four parts, each printing rows ``setting | request | model | class | influence | deciding |
limit | false?``:

- ``statistical``: trains a setting (the digits quickstart on seed 7; ``--wide``: 20 clients,
  Dirichlet alpha 0.5, participation 0.5, 3 attackers, seed 11), and for three requests
  (an honest client; all attackers, recover; one attacker of several with an honest client)
  opens the receipts with ``open_receipts`` (``--reference original``: the CLI's default
  options, or ``retrain``) and judges contaminated models (weight mixtures ``Retrain + lambda
  (original - Retrain)`` for lambda 0.1-0.5; the same mixtures stepped from an independent
  exact retrain, ``other + lambda (original - other)``; the original plus noise of std 1e-3)
  and clean ones (Retrain's result; two independent exact retrains, bare; a Retrain from
  another initial model; Retrain + 5 rounds of the remaining clients). False verdicts:
  contaminated and ``removed``; contaminated, ``not_detected`` with lambda >= the stated
  detection limit; clean and ``remains``.
- ``lineage``: what a result file's lineage claim makes of any model: a sealed Retrain result
  passed with the original model to ``audit_model(result=...)``; a Crab result whose lineage
  is edited to ``exact`` (not re-sealed, then re-sealed with ``history.digest.seal``); a
  method that declares M_0 as its start and mixes in ``context.final_params`` (unlogged).
- ``store``: a forgotten client's rows deleted with raw SQL (updates, its ``clients`` rows,
  its fingerprints), the store verdict of the receipt.
- ``samples``: a sample-level request (``--forget-samples``) served by ``tv_exact`` on a
  small digits run with ``training.sampling: tv_stable``, and clean controls judged on it.

    nice -n 10 python reproductions/verification/review_issue33.py lineage store samples
    nice -n 10 python reproductions/verification/review_issue33.py statistical [--wide]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import torch

from fedunlearn.config import load_config, parse_config
from fedunlearn.errors import IntegrityError
from fedunlearn.eval import ReceiptOptions, open_receipts
from fedunlearn.eval.distance_band import independent_retrains
from fedunlearn.eval.references import retrain_from_another_start
from fedunlearn.experiments import write_result
from fedunlearn.experiments.audit import audit_model
from fedunlearn.experiments.compare import unlearn_one
from fedunlearn.fl.attacks import choose_malicious
from fedunlearn.fl.engine import run_rounds
from fedunlearn.fl.seeding import derive_seed
from fedunlearn.history.digest import seal
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method
from fedunlearn.unlearn.base import Details, RunOutput, Unlearner
from fedunlearn.unlearn.registry import registered

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "configs/digits_quickstart.yaml"
LAMBDAS = (0.1, 0.2, 0.3, 0.4, 0.5)
OTHER_LAMBDAS = (0.3, 0.5)
WIDE = {
    "seed": 11,
    "data.num_clients": 20,
    "data.partition": "dirichlet",
    "data.alpha": 0.5,
    "training.participation": 0.5,
    "attack.num_malicious": 3,
}


ROWS: list[tuple] = []


def row(*cells: Any) -> None:
    """Print one table row as it comes (and keep it for the summary)."""
    ROWS.append(cells)
    print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


def attackers_of(config) -> list[int]:
    """The run's seeded attackers (``fl.attacks.choose_malicious``)."""
    return sorted(
        choose_malicious(
            config.data.num_clients,
            config.attack.num_malicious,
            derive_seed(config.seed, "attack", 0),
        )
    )


def classify(cls: str, label: str, receipt) -> str:
    """Whether a verdict is false: ``removed``/above-limit for contaminated, ``remains`` clean."""
    influence = receipt.influence
    if cls == "clean":
        return "FALSE remains" if influence == "remains" else ""
    if influence == "removed":
        return "FALSE removed"
    if influence == "not_detected" and label.startswith(("mixture", "other-mixture")):
        lam = float(label.split()[-1])
        limit = (receipt.detection_limit or {}).get("lambda")
        if limit is None or lam >= float(limit):
            return f"FALSE not_detected (lambda {lam:g} >= limit {limit})"
    return ""


def judged_models(session, request, seed):
    """The contaminated and clean models of one request (label -> (class, model))."""
    retrain = session.run(make_method("retrain"), request)
    o, r = session.run_view.final_params, retrain.params
    others, _ = independent_retrains(session, request, 2, seed=seed + 50)
    context = session.context(request)
    rounds = session.run_view.config.training.rounds
    more = run_rounds(
        context.clients,
        context.aggregator,
        r,
        num_rounds=rounds + 5,
        start_round=rounds + 1,
        participation=context.training.participation,
    )
    g = torch.Generator().manual_seed(seed)
    models: dict[str, tuple[str, Any]] = {
        **{f"mixture {lam:g}": ("contaminated", r + lam * (o - r)) for lam in LAMBDAS},
        **{
            f"other-mixture {lam:g}": ("contaminated", others[0] + lam * (o - others[0]))
            for lam in OTHER_LAMBDAS
        },
        "noise 1e-3": ("contaminated", o + torch.randn(o.shape, generator=g) * 1e-3),
        "retrain (result)": ("clean", retrain),
        "independent retrain 1": ("clean", others[0]),
        "independent retrain 2": ("clean", others[1]),
        "retrain, another M_0": ("clean", retrain_from_another_start(session, request, seed)),
        "retrain + 5 rounds": ("clean", more),
    }
    return retrain, models


def statistical(args) -> list[tuple]:
    """Train the setting and judge every model of every request; return the rows."""
    overrides = dict(WIDE) if args.wide else {"seed": args.seed}
    config = load_config(QUICKSTART, overrides)
    name = "wide(20c,dir0.5,p0.5,3att) seed 11" if args.wide else f"quickstart seed {args.seed}"
    attackers = attackers_of(config)
    honest = min(c for c in range(config.data.num_clients) if c not in attackers)
    requests = [
        (f"honest [{honest}]", [honest], "forget"),
        (f"attackers {attackers}", attackers, "recover"),
        (f"attacker+honest {[attackers[0], honest]}", [attackers[0], honest], "forget"),
    ]
    found = []
    with tempfile.TemporaryDirectory(prefix="review33-") as tmp:
        run = Path(tmp) / "run"
        train_run(config, run)
        for label, forget, kind in requests:
            request = UnlearnRequest.of(forget, kind)
            with UnlearnSession(run, evaluate=False) as session:
                retrain, models = judged_models(session, request, config.seed)
                for reference in args.references:
                    options = ReceiptOptions(reference, seed=config.seed, client_test_seconds=7200)
                    receipts = open_receipts(session, request, options, retrain=retrain)
                    for model, (cls, params) in models.items():
                        if hasattr(params, "params"):
                            receipt = receipts.verify(params).verification
                        else:
                            receipt = receipts.audit(params, model)[1]
                        limit = (receipt.detection_limit or {}).get("lambda")
                        cells = (
                            f"{name} ref={reference}",
                            label,
                            model,
                            cls,
                            receipt.influence,
                            ",".join(receipt.deciding) or receipt.influence_basis,
                            "-" if limit is None else f"{limit:g}",
                            classify(cls, model, receipt),
                        )
                        row(*cells)
                        found.append(cells)
    return found


class MixFinal(Unlearner):
    """A method that starts from M_0 and mixes in ``context.final_params`` without a read.

    What a third-party plugin can do: the context hands every method M_T as an attribute
    (``UnlearnContext.final_params``, "for shapes and dtypes"), and only reads through
    ``context.history`` are logged in the lineage.
    """

    name = "review_mix_final"

    def history_bytes_needed(self, context) -> int:
        """Nothing stored is needed."""
        return 0

    def _run(self, request, context) -> RunOutput:
        start = context.start_from(0)  # declared start: M_0, before any tainted round
        params = 0.999 * context.final_params + 0.001 * start  # 99.9 % the original
        return RunOutput(params, [], Details())


def lineage(args) -> list[tuple]:
    """Lineage claims: a result file for another model, an edited and re-sealed lineage."""
    config = load_config(QUICKSTART, {"seed": args.seed})
    out = []
    with tempfile.TemporaryDirectory(prefix="review33-lineage-") as tmp:
        run = Path(tmp) / "run"
        train_run(config, run)
        with UnlearnSession(run, evaluate=False) as session:
            original = session.run_view.final_params.clone()
        fast = {"client_test": False}
        files = Path(tmp) / "results"
        files.mkdir()
        # a Retrain result file, as 'fedunlearn unlearn --method retrain --out' writes it (sealed)
        result, summary = unlearn_one(run, [0], "retrain", verify=False)
        write_result(files / "retrain.json", summary, result)
        got = audit_model(run, original, [0], result=files / "retrain.json", **fast)
        out.append(
            ("original model + sealed Retrain result file", got["verification"]["influence"])
        )
        result, crab = unlearn_one(run, [0], "crab", verify=False)
        write_result(files / "crab.json", crab, result)
        edited = json.loads((files / "crab.json").read_text())
        edited["lineage"]["kind"] = "exact"
        (files / "edited.json").write_text(json.dumps(edited))
        try:
            got = audit_model(run, original, [0], result=files / "edited.json", **fast)
            verdict = got["verification"]["influence"]
        except IntegrityError as err:  # the seal refuses it: the expected outcome
            verdict = f"refused ({str(err)[:40]})"
        out.append(("crab result, lineage edited to exact, not re-sealed", verdict))
        edited.pop("integrity")
        seal(edited, crab["integrity"]["bound_to"])
        (files / "resealed.json").write_text(json.dumps(edited))
        got = audit_model(run, original, [0], result=files / "resealed.json", **fast)
        out.append(
            ("crab result, lineage edited to exact, re-sealed", got["verification"]["influence"])
        )
        with (
            registered("review_mix_final", MixFinal),
            UnlearnSession(run, evaluate=False) as session,
        ):
            request = UnlearnRequest.of([0], "forget")
            mixed = session.run(make_method("review_mix_final"), request)
            receipts = open_receipts(session, request, ReceiptOptions(client_test=False))
            verdict = receipts.verify(mixed).verification.influence
        out.append((f"plugin: 0.999 M_T + 0.001 M_0, lineage {mixed.lineage.kind}", verdict))
    for case, verdict in out:
        false = "FALSE removed" if verdict == "removed" else ""
        row(f"quickstart seed {args.seed}", "forget [0]", case, "contaminated", verdict, false)
    return out


def _raw_delete(db: Path, client: int, variant: str) -> None:
    """Delete ``client``'s rows from the history file with raw SQL (no deletion record)."""
    from fedunlearn.history.store import HistoryStore
    from fedunlearn.history.store.reconstruction import models_to_drop

    with HistoryStore.open(db.parent) as reader:  # what forget() would also drop
        models = models_to_drop(reader, [client])
    con = sqlite3.connect(db)
    con.execute("DELETE FROM payloads WHERE kind='update' AND client_id=?", (client,))
    if variant == "updates, prints and clients rows; models kept":
        con.execute("DELETE FROM payload_prints WHERE client_id=? AND kind='update'", (client,))
        con.execute("DELETE FROM clients WHERE client_id=?", (client,))
    elif variant != "updates only":
        for round_, kind in models:
            con.execute("DELETE FROM payloads WHERE round=? AND kind=?", (round_, kind))
            con.execute("DELETE FROM payload_prints WHERE round=? AND kind=?", (round_, kind))
        con.execute("DELETE FROM payload_prints WHERE client_id=? AND kind='update'", (client,))
        con.execute("UPDATE clients SET norm=NULL, scalars='{}' WHERE client_id=?", (client,))
    if variant == "all rows of the client":
        con.execute("DELETE FROM clients WHERE client_id=?", (client,))
    con.commit()
    con.close()


def store(args) -> list[tuple]:
    """Delete client 0's rows by raw SQL (three variants); the receipt's store verdict."""
    config = load_config(QUICKSTART, {"seed": args.seed})
    out = []
    with tempfile.TemporaryDirectory(prefix="review33-store-") as tmp:
        run = Path(tmp) / "run"
        train_run(config, run)
        for variant in (
            "updates only",
            "as forget drops, no record",
            "all rows of the client",
            "updates, prints and clients rows; models kept",
        ):
            work = Path(tmp) / "".join(c if c.isalnum() else "_" for c in variant)
            shutil.copytree(run, work)
            _raw_delete(work / "history" / "history.sqlite", 0, variant)
            try:
                with UnlearnSession(work, evaluate=False) as session:
                    request = UnlearnRequest.of([0], "forget")
                    receipts = open_receipts(session, request, ReceiptOptions(client_test=False))
                    _, receipt = receipts.audit(session.run_view.final_params, "original")
                got, codes = receipt.store, ",".join(receipt.check("deletion").codes)
            except Exception as err:  # noqa: BLE001 - a refusal to open is not a pass
                got, codes = "refused", f"{type(err).__name__}: {str(err)[:60]}"
            out.append((variant, got, codes))
            false = "FALSE deleted" if got == "deleted" else ""
            row(
                f"quickstart seed {args.seed}",
                "forget [0]",
                f"raw SQL: {variant}",
                got,
                codes,
                false,
            )
    return out


SAMPLES_CONFIG = {  # a small deletion-ready digits run (configs/mnist_deletion_ready.yaml's kind)
    "seed": 7,
    "data": {"dataset": "digits", "num_clients": 20, "partition": "dirichlet", "alpha": 0.5},
    "model": {"name": "mlp", "hidden": [64]},
    "training": {
        "rounds": 30,
        "participation": 0.25,
        "sampling": "tv_stable",
        "local_steps": 10,
        "batch_size": 10,
        "lr": 0.1,
    },
    "history": {"policy": "all"},
}


def samples(args) -> list[tuple]:
    """A sample-level request served by tv_exact on a TV-stable digits run; clean controls."""
    config = parse_config(SAMPLES_CONFIG, "review_issue33.SAMPLES_CONFIG")
    out = []
    with tempfile.TemporaryDirectory(prefix="review33-samples-") as tmp:
        run = Path(tmp) / "run"
        train_run(config, run)
        with UnlearnSession(run, evaluate=False) as session:
            client = 3
            ids = list(range(min(20, len(session.federation.client_data[client]))))
            request = UnlearnRequest.of([], "forget", {client: ids})
            exact = session.run(make_method("tv_exact"), request)
            retrain = session.run(make_method("retrain"), request)
            context = session.context(request)
            rounds = session.run_view.num_rounds
            more = run_rounds(
                context.clients,
                context.aggregator,
                retrain.params,
                num_rounds=rounds + 5,
                start_round=rounds + 1,
                participation=context.training.participation,
            )
            o = session.run_view.final_params
            models = {
                "tv_exact (result)": ("clean", exact),
                "retrain, bare": ("clean", retrain.params),
                "retrain + 5 rounds": ("clean", more),
                "original": ("contaminated", o),
                "mixture 0.5": ("contaminated", retrain.params + 0.5 * (o - retrain.params)),
            }
            for reference in args.references:
                options = ReceiptOptions(reference, seed=config.seed)
                receipts = open_receipts(session, request, options, retrain=retrain)
                for label, (cls, model) in models.items():
                    if hasattr(model, "params"):
                        receipt = receipts.verify(model).verification
                    else:
                        receipt = receipts.audit(model, label)[1]
                    limit = (receipt.detection_limit or {}).get("lambda")
                    cells = (
                        f"tv_stable digits seed 7 ref={reference}",
                        f"{len(ids)} samples of client {client}",
                        label,
                        cls,
                        receipt.influence,
                        ",".join(receipt.deciding) or receipt.influence_basis,
                        "-" if limit is None else f"{limit:g}",
                        classify(cls, label, receipt),
                    )
                    row(*cells)
                    out.append(cells)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="+", choices=("statistical", "lineage", "store", "samples"))
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--wide", action="store_true", help="20 clients, Dirichlet, p=0.5")
    parser.add_argument("--references", nargs="+", default=["original", "retrain"])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for part in args.parts:
        PARTS[part](args)
    for cls in ("contaminated", "clean"):
        mine = [r for r in ROWS if cls in r]
        false = [r for r in mine if "FALSE" in str(r[-1])]
        print(f"{cls}: {len(mine)} verdicts, {len(false)} false")
    stores = [r for r in ROWS if str(r[2]).startswith("raw SQL")]
    deleted = sum("FALSE" in r[-1] for r in stores)
    print(f"raw-SQL deletions: {len(stores)}, read as deleted: {deleted}")


PARTS = {"statistical": statistical, "lineage": lineage, "store": store, "samples": samples}

if __name__ == "__main__":
    main()
