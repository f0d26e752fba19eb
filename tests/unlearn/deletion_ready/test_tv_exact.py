"""TV-stable training and ``tv_exact``: exact unlearning bit for bit, mostly free (issue 32).

Spec: docs/deletion_ready.md. The identity test (§6.1 of the design note): unlearning a client, two
clients or samples of a client gives bit for bit the model of training from scratch on the reduced
data with the same seed, and Retrain's; the recomputation starts at the first round that drew the
client or used a sample.
"""

from __future__ import annotations

import pytest
import torch

from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError, UnsupportedHistoryError
from fedunlearn.fl.engine import run_rounds
from fedunlearn.history.policy import record_multiplicity
from fedunlearn.runs import train_run
from fedunlearn.runs.setup import build_setup, sampler_of
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

TV = {
    "seed": 1,
    "data": {"dataset": "digits", "num_clients": 12},
    "model": {"name": "logreg"},
    "training": {
        "rounds": 8,
        "lr": 0.3,
        "batch_size": 4,
        "participation": 0.2,
        "sampling": "tv_stable",
        "local_steps": 2,
        "executor": "serial",
    },
    "history": {"policy": "all"},
}


def _config(**training):
    return parse_config({**TV, "training": {**TV["training"], **training}})


def _scratch(config, *, without=(), samples=None):
    """Train ``config`` from scratch on the reduced data, with the run's sampler and seed."""
    setup = build_setup(config)
    try:
        fed = setup.federation if samples is None else setup.federation.without_samples(samples)
        ids = [c for c in fed.client_ids if c not in without]
        return run_rounds(
            fed,
            setup.aggregator,
            setup.initial_params,
            num_rounds=config.training.rounds,
            client_ids=ids,
            sampler=sampler_of(config),
        )
    finally:
        setup.close()


@pytest.fixture(scope="module")
def tv_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("tv") / "run"
    train_run(_config(), path)
    return path


@pytest.mark.parametrize(
    ("training", "message"),
    [
        ({"sampling": "tv_stable"}, "needs training.local_steps"),
        ({"local_steps": 3, "local_epochs": 2}, "both set local work"),
        (
            {"sampling": "tv_stable", "local_steps": 2, "aggregator": {"name": "median"}},
            "aggregates by multiplicity",
        ),
        ({"sampling": "tv_stable", "local_steps": 2, "local_epochs": 2}, "both set local work"),
    ],
)
def test_config_refuses_what_tv_stable_cannot_serve(training, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({"training": training})


def test_config_refuses_tv_stable_with_dp():
    with pytest.raises(ConfigError, match="privacy.enabled do not combine"):
        parse_config(
            {"training": {"sampling": "tv_stable", "local_steps": 2}, "privacy": {"enabled": True}}
        )


def test_a_client_smaller_than_a_mini_batch_is_refused_before_training(tmp_path):
    config = _config(batch_size=400)
    with pytest.raises(ConfigError, match="mini-batches of training.batch_size"):
        train_run(config, tmp_path / "run")
    assert not (tmp_path / "run" / "history" / "history.sqlite").exists()


def test_rounds_aggregate_by_multiplicity_not_by_size(tv_run):
    with UnlearnSession(tv_run, evaluate=False) as session:
        store = session.run_view.store
        sizes = session.run_view.client_sizes
        assert len(set(sizes.values())) > 1  # unequal n_c: weights by size would differ
        for round_ in range(1, 9):
            records = store.client_records(round_)
            counts = {r.client_id: record_multiplicity(r) for r in records}
            assert sum(counts.values()) == 2  # K = 0.2 x 12 clients, rounded
            updates = dict(store.iter_updates(round_))
            total = sum(counts.values())
            expected = sum(counts[c] / total * updates[c] for c in counts)
            got = store.read_model(round_, "aggregate")
            assert torch.allclose(got, expected, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("forget", [[3], [0, 7]])
def test_tv_exact_is_training_without_the_clients_bit_for_bit(tv_run, forget):
    request = UnlearnRequest.of(forget)
    with UnlearnSession(tv_run, evaluate=False) as session:
        tv = session.run(make_method("tv_exact"), request)
        retrain = session.run(make_method("retrain"), request)
        first = session.context(request).first_drawn_round(request.forget)
    assert torch.equal(tv.params, retrain.params)
    assert torch.equal(tv.params, _scratch(_config(), without=forget))
    assert tv.lineage is not None
    assert tv.lineage.kind == "exact"
    details = tv.details
    assert details.recomputed_from_round == first
    assert details.kept_rounds == (first - 1 if first else 8)
    assert tv.costs.client_participations <= retrain.costs.client_participations
    assert tv.trajectory is not None
    assert tv.trajectory.kept == details.kept_rounds
    assert tv.trajectory.length == 8


@pytest.mark.slow
def test_tv_exact_deletes_samples_exactly(tv_run):
    request = UnlearnRequest.of([], samples={5: [0, 1, 2, 40]})
    with UnlearnSession(tv_run, evaluate=False) as session:
        tv = session.run(make_method("tv_exact"), request)
        retrain = session.run(make_method("retrain"), request)
        first = session.context(request).first_use(frozenset(), request.sample_map)
    assert torch.equal(tv.params, retrain.params)
    assert torch.equal(tv.params, _scratch(_config(), samples={5: [0, 1, 2, 40]}))
    assert tv.lineage.kind == "exact"
    assert tv.details.recomputed_from_round == first
    assert tv.details.first_use == {"samples of client 5": first}


def test_a_request_the_run_never_touched_recomputes_nothing(tv_run):
    with UnlearnSession(tv_run, evaluate=False) as session:
        store = session.run_view.store
        drawn = {r.client_id for t in range(1, 9) for r in store.client_records(t)}
        never = min(set(range(12)) - drawn)
        result = session.run(make_method("tv_exact"), UnlearnRequest.of([never]))
        final = session.run_view.final_params
    assert torch.equal(result.params, final)
    assert result.costs.client_participations == 0
    assert result.details.recomputed_rounds == 0
    assert result.details.first_use == {f"client {never}": None}
    assert result.lineage.kind == "exact"


def test_methods_that_cannot_serve_samples_refuse_before_any_work(tv_run):
    request = UnlearnRequest.of([], samples={2: [1]})
    with UnlearnSession(tv_run, evaluate=False) as session:
        with pytest.raises(ConfigError, match="served exactly by .*tv_exact"):
            session.run(make_method("fedrecover"), request)


@pytest.mark.parametrize(
    ("samples", "message"),
    [({2: [10_000]}, "holds no sample with id"), ({2: list(range(110))}, "forget the client")],
)
def test_bad_sample_requests_are_one_line_errors(tv_run, samples, message):
    with UnlearnSession(tv_run, evaluate=False) as session:
        with pytest.raises(ConfigError, match=message):
            session.run(make_method("tv_exact"), UnlearnRequest.of([], samples=samples))


@pytest.mark.slow
def test_on_a_run_without_tv_stable_sampling_tv_exact_is_retrain_from_the_first_participation(
    tmp_path,
):
    config = parse_config(
        {
            **TV,
            "training": {"rounds": 4, "lr": 0.3, "executor": "serial", "participation": 0.25},
        }
    )
    train_run(config, tmp_path / "run")
    with UnlearnSession(tmp_path / "run", evaluate=False) as session:
        store = session.run_view.store
        late = max(
            range(12),
            key=lambda c: next(
                (t for t in range(1, 5) if any(r.client_id == c for r in store.client_records(t))),
                9,
            ),
        )
        request = UnlearnRequest.of([late])
        tv = session.run(make_method("tv_exact"), request)
        retrain = session.run(make_method("retrain"), request)
    assert torch.equal(tv.params, retrain.params)
    assert tv.lineage.kind == "exact"
    assert tv.costs.client_participations <= retrain.costs.client_participations


@pytest.mark.slow
def test_tv_exact_refuses_a_dp_run(tmp_path):
    config = parse_config(
        {
            **TV,
            "training": {"rounds": 2, "lr": 0.3, "executor": "serial"},
            "privacy": {"enabled": True, "clip_norm": 1.0},
        }
    )
    train_run(config, tmp_path / "run")
    with UnlearnSession(tmp_path / "run", evaluate=False) as session:
        with pytest.raises(UnsupportedHistoryError, match="dp=true"):
            session.run(make_method("tv_exact"), UnlearnRequest.of([1]))


def test_a_participation_index_edited_to_hide_a_client_is_refused(tv_run, tmp_path):
    import shutil
    import sqlite3

    run = tmp_path / "edited"
    shutil.copytree(tv_run, run)
    with UnlearnSession(run, evaluate=False) as session:
        store = session.run_view.store
        round_, client = next(
            (t, r.client_id) for t in range(1, 9) for r in store.client_records(t)
        )
    db = sqlite3.connect(run / "history" / "history.sqlite")
    with db:  # hide the client's participation in its first round (and its update)
        db.execute("DELETE FROM payloads WHERE round=? AND client_id=?", (round_, client))
        db.execute("DELETE FROM clients WHERE round=? AND client_id=?", (round_, client))
    db.close()
    with UnlearnSession(run, evaluate=False) as session:
        with pytest.raises(UnsupportedHistoryError, match="do not match the run's seeded draws"):
            session.run(make_method("tv_exact"), UnlearnRequest.of([client]))


def test_compare_all_runs_the_deletion_ready_methods_on_deletion_ready_runs_only(tmp_path):
    # on a FedAvg run tv_exact and shard_retrain are a full Retrain: the demo's comparison listed
    # them as the "cheapest" removed method at Retrain's 480 client epochs
    from fedunlearn.cli.main import methods_for

    fedavg = {
        "data": {"dataset": "digits", "num_clients": 4},
        "model": {"name": "logreg"},
        "training": {"rounds": 1, "executor": "serial"},
    }
    train_run(parse_config(fedavg), tmp_path / "fedavg")
    ready = {
        **fedavg,
        "training": {**fedavg["training"], "sampling": "tv_stable", "local_steps": 1},
    }
    train_run(parse_config(ready), tmp_path / "ready")
    plain = methods_for(tmp_path / "fedavg")
    assert "retrain" in plain
    assert "tv_exact" not in plain
    assert "shard_retrain" not in plain
    assert {"tv_exact", "shard_retrain"} <= set(methods_for(tmp_path / "ready"))


def test_a_request_first_used_in_round_one_names_no_empty_kept_range(tv_run):
    """A user review: the evidence read "rounds 1..0 drew no forgotten client ... are kept"."""
    with UnlearnSession(tv_run, evaluate=False) as session:
        context = session.context(UnlearnRequest.of([0]))
        first = [c for c in range(12) if context.first_drawn_round(frozenset({c})) == 1]
        tv = session.run(make_method("tv_exact"), UnlearnRequest.of(first[:1]))
    assert tv.details.kept_rounds == 0
    assert tv.details.recomputed_from_round == 1
    assert "1..0" not in tv.details.evidence
    assert "every round (1..8)" in tv.details.evidence
