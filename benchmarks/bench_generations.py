"""Measure the methods on an applied history: request 2 against request 1, in client epochs.

On a trained run (default: the digits quickstart, trained into ``--out`` if missing), for each
method M of FedRecover, Crab and FedEraser (and the issue's path FedRecover then Crab):

1. request 1: M forgets ``--first`` (default client 0) on the trained run;
2. apply: a fresh store holds M_0 and request 1's trajectory (``UnlearnResult.trajectory``), then
   ``--more`` rounds (default 10) trained on from its final model without the forgotten client,
   recorded with the run's rules (what ``apply`` + ``train --continue`` give);
3. request 2: the second method forgets the attackers and the earlier client (cumulative) on that
   history; Retrain on the same history is the reference for test accuracy and backdoor ASR.

Prints one JSON line per pair: client epochs, rounds and wall seconds of each request, and the
accuracy / ASR of request 2 next to Retrain's.

    python benchmarks/bench_generations.py --config configs/digits_quickstart.yaml --out /tmp/q
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from fedunlearn.config import load_config
from fedunlearn.fl.engine import run_rounds
from fedunlearn.history.policy import HistoryRecorder, RecordAll
from fedunlearn.history.store import HistoryStore, RoundEntry
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method
from fedunlearn.unlearn.context import (
    CostMeter,
    MeteredHistory,
    RemainingClients,
    TrainingInfo,
    UnlearnContext,
)

PAIRS = [
    ("fedrecover", "fedrecover"),
    ("crab", "crab"),
    ("federaser", "federaser"),
    ("fedrecover", "crab"),
]


def applied_history(path: Path, session: UnlearnSession, result, more: int) -> HistoryStore:
    """M_0, the result's trajectory, then ``more`` rounds trained on without its forgotten."""
    run = session.run_view
    store = HistoryStore.create(path, run.store.meta)
    store.write_round(RoundEntry(round=0, global_model=run.initial_params))
    for entry in result.trajectory.rounds:
        store.write_round(entry)
    last = result.trajectory.length
    forgotten = result.trajectory.forgotten
    run_rounds(
        session.federation,
        session._aggregator,
        result.params,
        num_rounds=last + more,
        start_round=last + 1,
        client_ids=[c for c in session.federation.client_ids if c not in forgotten],
        participation=run.config.training.participation,
        observers=[HistoryRecorder(store, RecordAll())],
    )
    return store


def context_on(store: HistoryStore, session: UnlearnSession, request: UnlearnRequest):
    """A metered context over ``store`` (round count: the store's), as a session builds one."""
    run = session.run_view
    last = store.last_round()
    meter = CostMeter()
    training = run.config.training
    return UnlearnContext(
        history=MeteredHistory(store, meter),
        clients=RemainingClients(session.federation, request.forget, meter),
        aggregator=session._aggregator,
        num_rounds=last,
        initial_params=store.read_model(0),
        final_params=store.read_model(last),
        meter=meter,
        training=TrainingInfo(training.participation, training.aggregator.name),
        recording=run.config.history,
        privacy=run.config.privacy,
        reference_provider=session.evaluation.reference_set,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/digits_quickstart.yaml")
    parser.add_argument("--out", default=None, help="run directory (trained if missing)")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--more", type=int, default=10)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="generations-"))
    run_dir = Path(args.out) if args.out else work / "run"
    if not (run_dir / "summary.json").exists():
        train_run(load_config(args.config), run_dir)
    with UnlearnSession(run_dir, evaluate=False) as session:
        evaluate = session.evaluation.evaluate
        first = UnlearnRequest.of([args.first])
        for i, (m1, m2) in enumerate(PAIRS):
            r1 = session.run(make_method(m1), first)
            store = applied_history(work / f"h{i}", session, r1, args.more)
            forget = sorted({args.first, *session.run_view.malicious})
            second = UnlearnRequest.of(forget, "recover")
            r2 = make_method(m2).unlearn(second, context_on(store, session, second))
            ref = make_method("retrain").unlearn(second, context_on(store, session, second))
            m_r2, m_ref = evaluate(r2.params), evaluate(ref.params)
            row = {
                "request_1": m1,
                "request_2": m2,
                "history_rounds": store.last_round(),
                "epochs_1": r1.costs.client_epochs,
                "epochs_2": r2.costs.client_epochs,
                "retrain_epochs_2": ref.costs.client_epochs,
                "rounds_1": r1.costs.rounds,
                "rounds_2": r2.costs.rounds,
                "wall_1": round(r1.costs.wall_seconds, 2),
                "wall_2": round(r2.costs.wall_seconds, 2),
                "estimated_in_history": r1.trajectory.estimated_updates(),
                "accuracy_2": m_r2.get("test_accuracy"),
                "asr_2": m_r2.get("backdoor_asr"),
                "retrain_accuracy_2": m_ref.get("test_accuracy"),
                "retrain_asr_2": m_ref.get("backdoor_asr"),
            }
            print(json.dumps(row), flush=True)
            store.close()


if __name__ == "__main__":
    main()
