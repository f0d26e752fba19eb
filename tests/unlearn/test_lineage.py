"""Lineage by construction: what each method's result was computed from, exact or approximate.

The rules (``fedunlearn.unlearn.lineage``): a result is ``exact`` iff its method read no update
of a forgotten client, no aggregate, global model or client update from the first round a
forgotten client was aggregated in (f) on, and declared a start model from before f.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from fedunlearn.config import load_config, parse_config
from fedunlearn.experiments import unlearn_one
from fedunlearn.runs import train_run
from fedunlearn.unlearn import (
    RunOutput,
    UnlearnRequest,
    UnlearnSession,
    available_methods,
    make_method,
)
from fedunlearn.unlearn.baselines.retrain import Retrain
from fedunlearn.unlearn.lineage import (
    MAX_LISTED,
    Read,
    ReadLog,
    first_tainted_round,
    trace_lineage,
)
from fedunlearn.unlearn.registry import registered

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "digits_quickstart.yaml"


def accepted_rounds(session: UnlearnSession, client_id: int) -> list[int]:
    """Rounds whose records show ``client_id``'s update accepted (read from the store)."""
    store = session.run_view.store
    return [
        t
        for t in range(1, session.run_view.config.training.rounds + 1)
        if any(r.client_id == client_id and r.status == "accepted" for r in store.client_records(t))
    ]


def run_with_log(session: UnlearnSession, method, request: UnlearnRequest):
    """Run ``method`` on a fresh context; return (result, the context's full read log)."""
    context = session.context(request)
    result = method.unlearn(request, context)
    return result, context.read_log


@pytest.fixture(scope="module")
def quickstart_run(tmp_path_factory):
    """configs/digits_quickstart.yaml as shipped (30 rounds, 10 clients, policy all)."""
    run = tmp_path_factory.mktemp("quickstart") / "run"
    train_run(load_config(QUICKSTART), run)
    return run


@pytest.fixture(scope="module")
def sparse_run(tmp_path_factory):
    """One client of five sampled per round for four rounds: some client never takes part."""
    cfg = {
        "seed": 2,
        "data": {"dataset": "digits", "num_clients": 5},
        "model": {"name": "mlp", "hidden": [16]},
        "training": {
            "rounds": 4,
            "local_epochs": 1,
            "lr": 0.3,
            "batch_size": 32,
            "participation": 0.2,
            "executor": "serial",
        },
        "history": {"policy": "all"},
    }
    run = tmp_path_factory.mktemp("sparse") / "run"
    train_run(parse_config(cfg), run)
    return run


# ----- the classification rules, on hand-made logs ----------------------------------------------


def test_a_rejected_update_does_not_taint_its_round():
    # Prepare: client 0 rejected in round 1, accepted in round 3
    accepted = [(1, [1, 2]), (2, [1, 2]), (3, [0, 1, 2])]
    # Execute / Assert
    assert first_tainted_round(accepted, [0]) == 3
    assert first_tainted_round(accepted, [5]) is None


def test_reading_a_forgotten_clients_rejected_update_taints_the_result():
    log = ReadLog()
    log.declare_start(0)
    log.record("global", 0)
    log.record("update", 1, 0)  # stored though rejected: still a function of client 0's data
    lineage = trace_lineage(log, [0], None, 5)
    assert lineage.kind == "approximate"
    assert lineage.tainted_reads["updates"] == [[1, 0]]


def test_remaining_updates_from_the_first_tainted_round_on_taint_and_earlier_ones_do_not():
    clean = ReadLog()
    clean.declare_start(0)
    clean.record("update", 2, 1)
    clean.record("global", 2)
    clean.record("aggregate", 2)
    assert trace_lineage(clean, [0], 3, 5).exact

    tainted = ReadLog()
    tainted.declare_start(0)
    tainted.record("update", 3, 1)  # round f: conservative, see the module docstring
    lineage = trace_lineage(tainted, [0], 3, 5)
    assert lineage.kind == "approximate"
    assert lineage.tainted_reads == {"updates": [[3, 1]], "aggregates": [], "models": []}


def test_a_start_at_or_after_the_first_tainted_round_is_approximate():
    log = ReadLog()
    log.declare_start(4)
    lineage = trace_lineage(log, [0], 3, 5)  # declared but (hypothetically) not logged as read
    assert lineage.kind == "approximate"
    assert "started from the global model M_4" in lineage.reason


def test_an_undeclared_start_is_approximate_even_with_clean_reads():
    log = ReadLog()
    log.record("global", 0)
    lineage = trace_lineage(log, [0], 3, 5)
    assert lineage.kind == "approximate"
    assert lineage.start == "not declared"
    assert "start_from" in lineage.reason


def test_tainted_reads_are_capped_with_the_totals_in_the_reason():
    log = ReadLog()
    log.declare_start(0)
    for t in range(1, 51):
        log.record("global", t)
        for c in range(4):
            log.record("update", t, c)
    lineage = trace_lineage(log, [0], 1, 50)
    assert len(lineage.tainted_reads["updates"]) == MAX_LISTED
    assert len(lineage.tainted_reads["models"]) == MAX_LISTED
    # the forgotten client's own updates are listed first
    assert lineage.tainted_reads["updates"][0] == [1, 0]
    assert all(c == 0 for _, c in lineage.tainted_reads["updates"])
    assert "50 updates of client 0, 150 updates of remaining clients" in lineage.reason
    assert "50 global models" in lineage.reason
    assert len(json.dumps(lineage.to_dict())) < 2000


def test_repeated_reads_are_logged_once():
    log = ReadLog()
    for _ in range(3):
        log.record("update", 2, 1)
    assert log.reads == (Read(2, "update", 1),)


def test_metered_history_logs_payload_reads_and_nothing_else(run_all):
    with UnlearnSession(run_all) as session:
        context = session.context(UnlearnRequest.of([0]))
        history = context.history
        history.client_records(2)
        history.round_scalars(2)
        history.has_update(2, 1)
        history.read_model(1, "aggregate")
        history.read_model(1)
        ids = [cid for cid, _ in history.iter_updates(3)]
        start = context.start_from(0)
    assert torch.equal(start, session.run_view.initial_params)
    assert context.read_log.reads == (
        Read(1, "aggregate"),
        Read(1, "global"),
        *(Read(3, "update", c) for c in ids),
        Read(0, "global"),
    )
    assert context.read_log.start_round == 0


def test_a_context_over_an_unmetered_history_has_no_lineage(run_all):
    with UnlearnSession(run_all) as session:
        request = UnlearnRequest.of([0])
        context = dataclasses.replace(session.context(request), history=session.run_view.store)
        result = make_method("retrain").unlearn(request, context)
    assert result.lineage is None


# ----- built-in methods on real runs ------------------------------------------------------------


@pytest.mark.slow
def test_retrain_is_exact_on_the_quickstart(quickstart_run):
    with UnlearnSession(quickstart_run) as session:
        result = session.run(make_method("retrain"), UnlearnRequest.of([0]))
        first = accepted_rounds(session, 0)[0]
    lineage = result.lineage
    assert lineage is not None
    assert lineage.exact
    assert lineage.start_round == 0
    assert lineage.first_tainted_round == first
    assert lineage.tainted_reads == {"updates": [], "aggregates": [], "models": []}


@pytest.mark.slow
def test_crab_default_on_the_quickstart_is_approximate_because_its_replay_reads_tainted_norms(
    quickstart_run,
):
    """Crab's participation rollback starts from a clean model, but its calibrated replay
    rescales each fresh update to the norm of the client's *stored* update of a round >= f,
    trained from a model holding client 0's updates: the result depends on them."""
    with UnlearnSession(quickstart_run) as session:
        request = UnlearnRequest.of([0])
        result, log = run_with_log(session, make_method("crab"), request)
    details, lineage = result.details, result.lineage
    assert details.rollback == "participation"
    assert details.rollback_free_of_forgotten
    assert lineage.kind == "approximate"
    assert lineage.start_round == details.rollback_round < lineage.first_tainted_round
    replayed = {
        Read(int(t), "update", c) for t, ids in details.participants.items() for c in ids if ids
    }
    assert replayed, "the replay read no stored update"
    assert all(r.round >= lineage.first_tainted_round for r in replayed)
    assert replayed <= set(log.reads)
    assert "updates of remaining clients" in lineage.reason


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("none", None),
        ("federaser", None),
        ("fedrecover", {"warmup_rounds": 3, "final_rounds": 1}),
    ],
)
def test_approximate_methods_name_what_carries_the_forgotten_client(name, params, run_all):
    with UnlearnSession(run_all) as session:
        first = accepted_rounds(session, 0)[0]
        result, log = run_with_log(session, make_method(name, params), UnlearnRequest.of([0]))
    lineage = result.lineage
    assert lineage.kind == "approximate"
    reads = lineage.tainted_reads
    assert reads["updates"] or reads["models"] or reads["aggregates"]
    assert all(t >= first or c == 0 for t, c in reads["updates"])
    assert all(t >= first for t in reads["models"] + reads["aggregates"])
    if name == "none":
        assert reads["models"] == [session.run_view.config.training.rounds]
    if name == "fedrecover":  # estimated rounds read the original trajectory's models
        assert reads["models"]


def test_fedrecover_that_only_retrains_is_exact(run_all):
    """5 rounds within warm-up + final exact rounds: every update is fresh, nothing stored is
    read beyond M_0; the lineage says so rather than assuming by method name."""
    with UnlearnSession(run_all) as session:
        result = session.run(make_method("fedrecover"), UnlearnRequest.of([0]))
    assert result.details.estimated_updates == 0
    assert result.lineage.exact


def test_forgetting_a_client_that_never_took_part_is_exact_for_every_method(sparse_run):
    with UnlearnSession(sparse_run) as session:
        store = session.run_view.store
        sampled = {r.client_id for t in range(1, 5) for r in store.client_records(t)}
        absent = sorted(set(session.run_view.client_ids) - sampled)
        assert absent, "precondition: some client was never sampled"
        for name in available_methods():
            result = session.run(make_method(name), UnlearnRequest.of([absent[0]]))
            assert result.lineage.exact, (name, result.lineage.reason)
            assert result.lineage.first_tainted_round is None


def test_starfish_on_two_in_process_servers_declares_its_start(run_all):
    """Party 0's reads of its share store go to the context's log, its start included."""
    with UnlearnSession(run_all) as session:
        result = session.run(make_method("starfish", {"backend": "mpc"}), UnlearnRequest.of([0]))
    assert result.lineage.start_round == 0
    assert result.lineage.kind == "approximate"
    assert [1, 0] in result.lineage.tainted_reads["updates"]


# ----- mutants: the log sees what a method does, not what it is called ---------------------------


class _PeekingRetrain(Retrain):
    """Retrain that also reads one stored update of the forgotten client (and ignores it)."""

    def _run(self, request, context):
        client = min(request.forget)
        for t in range(1, context.num_rounds + 1):
            if context.history.has_update(t, client):
                context.history.read_update(t, client)
                break
        return super()._run(request, context)


class _UndeclaredRetrain(Retrain):
    """Retrain that reads M_0 directly instead of declaring it with ``start_from``."""

    def _run(self, request, context):
        context.history.read_model(0)
        return RunOutput(context.initial_params.clone())


class _ReturnsFinal(Retrain):
    """Declares M_0 but returns the context's final model without reading it."""

    def _run(self, request, context):
        context.start_from(0)
        return RunOutput(context.final_params.clone())


def test_a_method_that_reads_one_forgotten_update_becomes_approximate(run_all):
    with registered("peeking", _PeekingRetrain), UnlearnSession(run_all) as session:
        first = accepted_rounds(session, 0)[0]
        honest = session.run(make_method("retrain"), UnlearnRequest.of([0]))
        peeking = session.run(make_method("peeking"), UnlearnRequest.of([0]))
    assert honest.lineage.exact
    assert torch.equal(honest.params, peeking.params)  # same model, different evidence
    assert peeking.lineage.kind == "approximate"
    assert peeking.lineage.tainted_reads["updates"] == [[first, 0]]


def test_a_method_that_declares_no_start_is_approximate(run_all):
    with registered("undeclared", _UndeclaredRetrain), UnlearnSession(run_all) as session:
        result = session.run(make_method("undeclared"), UnlearnRequest.of([0]))
    assert result.lineage.kind == "approximate"
    assert result.lineage.start == "not declared"


def test_returning_the_final_model_unread_counts_as_reading_it(run_all):
    with registered("returns_final", _ReturnsFinal), UnlearnSession(run_all) as session:
        result = session.run(make_method("returns_final"), UnlearnRequest.of([0]))
        final = session.run_view.config.training.rounds
    assert result.lineage.kind == "approximate"
    assert result.lineage.tainted_reads["models"] == [final]


# ----- where the lineage goes -------------------------------------------------------------------


def test_the_result_json_carries_the_lineage(run_all):
    _, summary = unlearn_one(run_all, [0], "retrain", verify=False)
    assert summary["lineage"]["kind"] == "exact"
    assert summary["lineage"]["start_round"] == 0
    json.dumps(summary["lineage"])
