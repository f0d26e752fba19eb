"""The one cost record and the shared round bookkeeping (issue 20)."""

import time
from pathlib import Path

import pytest
import torch

import fedunlearn.unlearn
from fedunlearn.fl.records import RoundRecord
from fedunlearn.unlearn import Costs, UnlearnRequest, UnlearnSession
from fedunlearn.unlearn.costs import CostMeter

UNLEARN = Path(fedunlearn.unlearn.__file__).parent


def test_the_meter_adds_to_the_costs_record_and_refuses_unknown_counters():
    meter = CostMeter()
    meter.add(rounds=1, client_epochs=3)
    meter.add(client_epochs=2)
    assert meter.costs == Costs(rounds=1, client_epochs=5)
    counts = {k: v for k, v in Costs(rounds=1, client_epochs=5).to_dict().items() if type(v) is int}
    assert meter.counts() == counts
    assert "wall_seconds" not in counts
    assert "server_seconds" not in counts
    with pytest.raises(ValueError, match="not a cost counter: wall_seconds"):
        meter.add(wall_seconds=1)
    with pytest.raises(ValueError, match="not a cost timer: wall_seconds"):
        with meter.timed("wall_seconds"):
            pass
    with pytest.raises(ValueError, match="not a cost counter: round;"):
        meter.add(round=1)


def test_a_context_counts_each_round_it_closes_and_returns_its_row(run_all):
    with UnlearnSession(run_all) as session:
        context = session.context(UnlearnRequest.of([1]))
        params = session.run_view.final_params
        row = context.end_round(3, params)
        assert row == {"round": 3, **session.evaluation.evaluate(params)}
        record = RoundRecord(
            round=4,
            global_before=params,
            global_after=params,
            aggregate=torch.zeros_like(params),
            updates=(),
            rejected=(),
            metrics={"train_loss": 0.5},
        )
        assert context.record_round(record) == {"round": 4, "train_loss": 0.5}
        assert context.meter.costs.rounds == 2
    with UnlearnSession(run_all, evaluate=False) as session:
        context = session.context(UnlearnRequest.of([1]))
        assert context.end_round(1, session.run_view.final_params) == {"round": 1}
        assert context.meter.costs.rounds == 1


def test_no_method_counts_its_rounds_by_hand():
    by_hand = [
        f"{path.relative_to(UNLEARN)}:{n}"
        for path in sorted(UNLEARN.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if "rounds += " in line and "meter" in line
    ]
    assert by_hand == []


def test_the_wall_time_leaves_out_evaluation_and_diagnostics_and_splits_server_from_clients():
    meter = CostMeter()
    meter.costs = Costs(client_train_seconds=2.0, evaluation_seconds=3.0)
    with meter.diagnostic() as before:
        meter.add(client_epochs=7, history_bytes_read=100)  # the diagnostic's work: not a cost
        with meter.timed("client_train_seconds"):
            time.sleep(0.02)
    assert before.client_epochs == 0
    c = meter.costs
    assert (c.client_epochs, c.history_bytes_read, c.client_train_seconds) == (0, 0, 2.0)
    assert 0.02 <= c.diagnostic_seconds < 1.0
    done = meter.finish(10.0 + c.diagnostic_seconds)
    assert done.wall_seconds == pytest.approx(7.0)  # 10 s + diagnostic - 3 s of evaluation
    assert done.server_seconds == pytest.approx(5.0)  # 7 s - 2 s of client training
    assert done.elapsed_seconds == pytest.approx(10.0 + c.diagnostic_seconds)
    assert meter.finish(1.0).server_seconds == 0.0  # never below zero


def test_a_methods_wall_time_leaves_out_its_per_round_evaluation(run_all):
    """Defect (issue 35): ``costs.wall_seconds`` counted the per-round test evaluation."""
    pause = 0.05
    with UnlearnSession(run_all) as session:
        evaluate = session.evaluation.evaluate

        def slow(params):
            time.sleep(pause)
            return evaluate(params)

        session.evaluation.evaluate = slow
        began = time.perf_counter()
        result = session.run(fedunlearn.unlearn.make_method("retrain"), UnlearnRequest.of([1]))
        outside = time.perf_counter() - began
    c = result.costs
    assert c.rounds == 5
    assert c.evaluation_seconds >= 5 * pause
    assert c.wall_seconds <= outside - 5 * pause  # the five pauses are not the method's time
    assert c.client_train_seconds > 0
    assert c.client_epochs == 5 * 4 * 2
    assert c.server_seconds == pytest.approx(c.wall_seconds - c.client_train_seconds)
    assert c.elapsed_seconds >= c.wall_seconds + 5 * pause


def test_the_session_builds_the_executor_before_a_methods_clock_starts(run_all, monkeypatch):
    """Building the executor (data stacked, lazy torch imports: 1-3 s) is setup: in a compare
    Retrain, which trains first, was charged it, and every other method's wall ratio gained."""
    from fedunlearn.fl import executors

    built: list[str] = []
    real = executors.make_executor

    def counting(*args, **kwargs):
        built.append("executor")
        return real(*args, **kwargs)

    monkeypatch.setattr(executors, "make_executor", counting)
    with UnlearnSession(run_all, evaluate=False) as session:
        request = UnlearnRequest.of([1])
        session.context(request)
        assert built == ["executor"]
        session.run(fedunlearn.unlearn.make_method("retrain"), request)
        assert built == ["executor"]  # the method's clock saw no setup


@pytest.mark.slow
def test_building_an_executor_imports_what_the_first_training_step_would():
    """torch imports torch._dynamo on the first grad/optimizer step; the executor does it first."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from fedunlearn.fl.executors import make_executor\n"
        "from fedunlearn.fl.records import ClientData\n"
        "data = {0: ClientData(torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))}\n"
        "before = 'torch._dynamo' in sys.modules\n"
        "make_executor(torch.nn.Linear(3, 2), data, 'vectorized')\n"
        "print(before, 'torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


def test_a_context_parses_each_rounds_client_records_once(run_all):
    """A replay asks for a round's records several times; the store is read once a round."""
    from fedunlearn.history.store import HistoryStore
    from fedunlearn.unlearn.context import MeteredHistory

    with HistoryStore.open(run_all / "history") as store:
        reads: list[int] = []
        real = store.client_records

        def counting(round_):
            reads.append(round_)
            return real(round_)

        store.client_records = counting  # type: ignore[method-assign]
        history = MeteredHistory(store, CostMeter())
        first = history.client_records(2)
        first.clear()  # a caller's list is its own
        again = history.client_records(2)
        history.client_records(3)
        assert reads == [2, 3]
        assert again == real(2)
        assert len(again) > 0
