"""When attackers attack: ``attack.start_round`` (honest before it) and ``attack.join_round``."""

from __future__ import annotations

import pytest
import torch

from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError
from fedunlearn.fl.aggregators import fedavg
from fedunlearn.fl.attacks import UpdateAttack
from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.clients import TrainTask
from fedunlearn.fl.engine import run_rounds
from fedunlearn.fl.federation import Federation
from fedunlearn.fl.records import ClientData, ClientUpdate
from fedunlearn.history import HistoryStore
from fedunlearn.models import build_model, get_flat_params
from fedunlearn.runs import train_run


def blobs(num_clients=4, n=40, d=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(3, d, generator=g) * 3
    out = {}
    for c in range(num_clients):
        y = torch.randint(0, 3, (n,), generator=g)
        out[c] = ClientData(centers[y] + torch.randn(n, d, generator=g), y)
    return out


@pytest.mark.parametrize("executor", ["serial", "vectorized"])
def test_a_data_attacker_trains_on_its_clean_data_before_the_start_round(executor):
    # Prepare: client 1 holds flipped labels; its clean copy is its honest data until round 3
    model = build_model("logreg", (6,), 3, seed=0)
    spec = LocalTrainingSpec(epochs=1, lr=0.1, batch_size=8)
    clean = blobs()
    poisoned = {**clean, 1: ClientData(clean[1].x, 2 - clean[1].y)}
    attacked = Federation(
        model,
        poisoned,
        spec,
        seed=3,
        honest_data={1: clean[1]},
        attack_start_round=3,
        executor=executor,
    )
    honest = Federation(model, clean, spec, seed=3, executor=executor)
    always = Federation(model, poisoned, spec, seed=3, executor=executor)
    params = get_flat_params(model)
    # Execute / Assert: rounds 1-2 as if honest, round 3 on the poisoned data; ids kept
    for round_, reference in ((1, honest), (2, honest), (3, always)):
        got = attacked.train(TrainTask(params, [0, 1, 2], round_))
        want = reference.train(TrainTask(params, [0, 1, 2], round_))
        assert [u.client_id for u in got] == [0, 1, 2]
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a.delta, b.delta)
            assert a.num_samples == b.num_samples
    task = TrainTask(params, [1], 1)
    assert not torch.equal(attacked.train(task)[0].delta, always.train(task)[0].delta)


def test_an_update_attack_passes_rounds_before_its_start_unchanged():
    updates = [ClientUpdate(0, torch.ones(50), 5, 0.0), ClientUpdate(1, torch.ones(50), 5, 0.0)]
    attack = UpdateAttack("trim_random", frozenset({1}), seed=0, start_round=4)
    before = attack(3, torch.zeros(50), updates)
    assert all(torch.equal(a.delta, b.delta) for a, b in zip(before, updates, strict=True))
    after = attack(4, torch.zeros(50), updates)
    assert torch.equal(after[0].delta, updates[0].delta)
    assert not torch.equal(after[1].delta, updates[1].delta)


def test_a_late_client_is_never_sampled_before_its_join_round():
    model = build_model("logreg", (6,), 3, seed=0)
    fed = Federation(
        model,
        blobs(6),
        LocalTrainingSpec(epochs=1, lr=0.1, batch_size=8),
        seed=1,
        executor="serial",
    )
    seen = {}

    class Spy:
        def on_round_end(self, record):
            seen[record.round] = record.participants

    run_rounds(
        fed,
        fedavg,
        get_flat_params(model),
        num_rounds=8,
        participation=0.5,
        join_rounds={4: 5, 5: 5},
        observers=[Spy()],
    )
    assert all(not {4, 5} & set(seen[t]) for t in range(1, 5))
    assert all(len(seen[t]) == 2 for t in range(1, 5))  # half of the 4 clients present
    assert all(len(seen[t]) == 3 for t in range(5, 9))  # half of all 6
    assert any({4, 5} & set(seen[t]) for t in range(5, 9))


RUN = {
    "seed": 0,
    "data": {"dataset": "digits", "num_clients": 5},
    "model": {"name": "mlp", "hidden": [16]},
    "training": {"rounds": 4, "local_epochs": 1, "lr": 0.3, "batch_size": 32},
    "history": {"policy": "none"},
}


@pytest.mark.parametrize(
    "attack",
    [
        {"kind": "backdoor", "num_malicious": 1, "trigger_size": 3, "start_round": 3},
        {"kind": "trim_random", "num_malicious": 1, "start_round": 3},
    ],
)
def test_a_run_follows_the_clean_runs_models_until_the_attack_starts(tmp_path, attack):
    train_run(parse_config({**RUN, "attack": attack}), tmp_path / "attacked")
    train_run(parse_config(RUN), tmp_path / "clean")
    with (
        HistoryStore.open(tmp_path / "attacked" / "history") as a,
        HistoryStore.open(tmp_path / "clean" / "history") as b,
    ):
        for t in (1, 2):
            assert torch.equal(a.read_model(t), b.read_model(t))
        assert not torch.equal(a.read_model(3), b.read_model(3))


def test_attack_schedule_is_validated():
    with pytest.raises(ConfigError, match=r"attack.start_round \(9\) is after the last round"):
        parse_config({**RUN, "attack": {"kind": "backdoor", "num_malicious": 1, "start_round": 9}})
    with pytest.raises(ConfigError, match="with attack.kind 'none' leave them at 1"):
        parse_config({**RUN, "attack": {"join_round": 2}})
    with pytest.raises(ConfigError, match="join_round"):
        parse_config({**RUN, "attack": {"kind": "backdoor", "num_malicious": 1, "join_round": 0}})
