"""Deletion-ready training over Flower (issue 32, item 8): TV-stable rounds and ``tv_exact``.

Fast: the messages go to ClientApps in this process (``LocalGrid``: fedunlearn's ServerApp and
ClientApp; ``OwnGrid``: a user's app with its strategy in ``Recording``). fedunlearn's own
ServerApp must record the in-process run bit for bit and ``tv_exact`` over the Grid must return
the in-process method's model; over a user's app, ``tv_exact`` recomputes only from the first
round that drew the client and returns, bit for bit, the model of training the app from scratch
without the client.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip(
    "flwr", reason='Flower is not installed; pip install -e ".[flower]" to run these tests'
)

import own_app_support as own  # noqa: E402
from flower_support import assert_same_history, small_config  # noqa: E402
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from test_flower_protocol import LocalGrid, task_identity  # noqa: E402, F401
from test_flower_recording import OwnGrid  # noqa: E402

from fedunlearn import train_run  # noqa: E402
from fedunlearn.errors import ConfigError  # noqa: E402
from fedunlearn.fl.sampling import TvStableSampler  # noqa: E402
from fedunlearn.history import HistoryStore  # noqa: E402
from fedunlearn.history.policy import record_multiplicity  # noqa: E402
from fedunlearn.integrations.flower.app_unlearn import unlearn_over_app  # noqa: E402
from fedunlearn.integrations.flower.recording import Recording  # noqa: E402
from fedunlearn.integrations.flower.server_app import (  # noqa: E402
    FlowerJob,
    train_on_grid,
    unlearn_on_grid,
)
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method  # noqa: E402

NODES4 = {9_001: 2, 7_005: 0, 8_003: 1, 6_007: 3}


def tv_config(rounds: int = 4):
    return small_config(
        num_clients=4, rounds=rounds, sampling="tv_stable", local_steps=2, participation=0.5
    )


def test_tv_stable_training_over_a_grid_is_the_in_process_run(tmp_path):
    """Before: HistoryStrategy sampled a fraction without replacement and sent no local steps."""
    config = tv_config()
    train_run(config, tmp_path / "inproc")
    grid = LocalGrid(NODES4)

    train_on_grid(grid, config, FlowerJob("train", tmp_path / "flower", Path("/unused.yaml")))

    assert_same_history(tmp_path / "inproc", tmp_path / "flower", rounds=4)
    with (
        HistoryStore.open(tmp_path / "flower" / "history") as got,
        HistoryStore.open(tmp_path / "inproc" / "history") as want,
    ):
        assert torch.equal(got.read_model(4), want.read_model(4))
        for r in range(1, 5):
            mult = {c.client_id: record_multiplicity(c) for c in got.client_records(r)}
            assert mult == {c.client_id: record_multiplicity(c) for c in want.client_records(r)}
            assert sum(mult.values()) == 2  # K = 0.5 x 4 draws, with replacement
    # a client drawn twice got one message: one train message per distinct client and round
    trains = [ids[0] for _, kind, ids in grid.sent if kind == "train"]
    with HistoryStore.open(tmp_path / "flower" / "history") as got:
        assert len(trains) == sum(len(got.client_records(r)) for r in range(1, 5))


def test_tv_exact_over_a_grid_equals_the_in_process_method(tmp_path):
    config = tv_config(rounds=6)
    run = tmp_path / "run"
    train_run(config, run)
    with UnlearnSession(run) as session:
        want = session.run(make_method("tv_exact"), UnlearnRequest.of([3]))
    out = tmp_path / "tv.json"

    summary = unlearn_on_grid(
        LocalGrid(NODES4),
        FlowerJob("unlearn", run, method="tv_exact", forget=(3,), result_path=out),
    )

    from fedunlearn.models import get_flat_params, load_model

    assert torch.equal(get_flat_params(load_model(out.with_suffix(".safetensors"))), want.params)
    details = summary["details"]
    assert details["recomputed_from_round"] == want.details.recomputed_from_round
    assert summary["costs"]["client_participations"] == want.costs.client_participations
    assert summary["lineage"]["kind"] == "exact"


# ----- a user's app: Recording(strategy, sampling="tv_stable") ---------------------------

OWN4 = {90_017: {"partition-id": 2}, 70_051: {"partition-id": 0}, 80_033: {"partition-id": 1}}
OWN4[60_011] = {"partition-id": 3}


def record_tv(tmp_path, name, nodes, rounds=5, **kwargs):
    net = own.tiny_net(own.INPUT_SHAPE, own.NUM_CLASSES)
    strategy = Recording(
        FedAvg(fraction_train=0.5, fraction_evaluate=0.0, min_available_nodes=1),
        run_dir=tmp_path / name,
        model=own.MODEL,
        input_shape=own.INPUT_SHAPE,
        sampling="tv_stable",
        local_steps=2,
        batch_size=8,
        seed=11,
        **kwargs,
    )
    grid = OwnGrid(nodes)
    result = strategy.start(
        grid,
        ArrayRecord(net.state_dict()),
        num_rounds=rounds,
        train_config=ConfigRecord({"lr": 0.2}),
        evaluate_fn=lambda r, arrays: MetricRecord({"accuracy": 0.5}),
    )
    return result, grid


def test_recording_draws_fats_multisets_and_weighs_by_multiplicity(tmp_path):
    own.STEPS.clear()
    _, grid = record_tv(tmp_path, "run", OWN4)

    sampler = TvStableSampler(2, 11)  # K = round(0.5 x 4), the run seed
    with HistoryStore.open(tmp_path / "run" / "history") as store:
        for r in range(1, 6):
            draw = sampler.draw(r, [0, 1, 2, 3])
            records = store.client_records(r)
            assert {c.client_id: record_multiplicity(c) for c in records} == dict(draw.multiplicity)
            updates = dict(store.iter_updates(r))
            weights = {c: float(m) for c, m in draw.multiplicity.items()}
            mean = sum(weights[c] * d for c, d in updates.items()) / sum(weights.values())
            torch.testing.assert_close(store.read_model(r, "aggregate"), mean, atol=1e-6, rtol=0)
    trains = [t for _, t in grid.sent if t == "train"]
    assert len(trains) == sum(len(sampler.draw(r, [0, 1, 2, 3]).ids) for r in range(1, 6))
    assert set(own.STEPS) == {2}  # each client drew its 2 mini-batches with local_batches


def test_tv_exact_over_the_app_is_training_without_the_client(tmp_path):
    record_tv(tmp_path, "run", OWN4)
    sampler = TvStableSampler(2, 11)
    forget, rest = 1, [0, 2, 3]
    first = next(r for r in range(1, 6) if forget in sampler.draw(r, [0, 1, 2, 3]).ids)
    assert first == 3  # rounds 1 and 2 never drew client 1 (seed 11): they are kept

    out = unlearn_over_app(OwnGrid(OWN4), tmp_path / "run", "tv_exact", [forget])

    # the app trained from scratch without the client's node (K frozen at 2 of 4 clients)
    without = {n: c for n, c in OWN4.items() if c["partition-id"] != forget}
    scratch, _ = record_tv(tmp_path, "scratch", without, num_clients=4)
    from fedunlearn.models import load_model

    model = load_model(out["model_file"], factory=own.tiny_net)
    want = {k: torch.from_numpy(v.numpy()) for k, v in scratch.arrays.items()}
    for key, value in model.state_dict().items():
        assert torch.equal(value, want[key]), key
    assert out["details"]["recomputed_from_round"] == first
    assert out["details"]["kept_rounds"] == first - 1
    assert out["lineage"]["kind"] == "exact"
    # only the recomputed rounds' clients trained, each drawn client once per round
    asked = sum(len(sampler.draw(r, rest).ids) for r in range(first, 6))
    assert out["costs"]["client_participations"] == asked


def test_tv_stable_needs_the_local_steps_named(tmp_path):
    net = own.tiny_net(own.INPUT_SHAPE, own.NUM_CLASSES)
    strategy = Recording(FedAvg(), run_dir=tmp_path / "run", sampling="tv_stable")
    with pytest.raises(ConfigError, match="local-steps"):
        strategy.start(OwnGrid(OWN4), ArrayRecord(net.state_dict()), num_rounds=1)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_tv_stable_run_and_tv_exact_under_flwr_run_equal_in_process(tmp_path, flower_lock):
    """The example app on the Simulation Runtime: TV-stable training, then tv_exact."""
    from flower_support import write_config

    from fedunlearn.integrations.flower.simulation import simulate
    from fedunlearn.models import get_flat_params, load_model

    config = tv_config(rounds=3)  # seed 7: client 3 first drawn in round 2; round 1 is kept
    path = write_config(config, tmp_path / "config.yaml")
    train_run(config, tmp_path / "inproc")
    app = Path(__file__).resolve().parents[2] / "examples" / "flower-app"

    simulate(FlowerJob("train", tmp_path / "flower", path), 4, num_cpus=2, app_dir=app)
    assert_same_history(tmp_path / "inproc", tmp_path / "flower", rounds=3)
    out = tmp_path / "tv.json"
    job = FlowerJob("unlearn", tmp_path / "flower", method="tv_exact", forget=(3,), result_path=out)
    simulate(job, 4, num_cpus=2, app_dir=app)

    with UnlearnSession(tmp_path / "inproc") as session:
        want = session.run(make_method("tv_exact"), UnlearnRequest.of([3]))
    got = get_flat_params(load_model(out.with_suffix(".safetensors")))
    torch.testing.assert_close(got, want.params, atol=1e-6, rtol=0)
    summary = json.loads(out.read_text())
    assert summary["details"]["recomputed_from_round"] == want.details.recomputed_from_round == 2
    assert summary["costs"]["client_participations"] == want.costs.client_participations
