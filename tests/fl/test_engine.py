from dataclasses import replace

import pytest
import torch

from fedunlearn.errors import ConfigError, UnknownClientError
from fedunlearn.fl.aggregators import fedavg, make_aggregator
from fedunlearn.fl.client import LocalTrainingSpec, local_update
from fedunlearn.fl.clients import TrainTask
from fedunlearn.fl.engine import (
    all_finite,
    run_round,
    run_rounds,
    sample_clients,
    screen_update,
)
from fedunlearn.fl.federation import Federation
from fedunlearn.fl.metrics import accuracy_and_loss
from fedunlearn.fl.records import ClientData, ClientUpdate
from fedunlearn.fl.seeding import derive_seed
from fedunlearn.models import build_model, get_flat_params


def blobs(num_clients=4, n=60, d=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(3, d, generator=g) * 3
    out = {}
    for c in range(num_clients):
        y = torch.randint(0, 3, (n + 7 * c,), generator=g)
        out[c] = ClientData(centers[y] + torch.randn(len(y), d, generator=g), y)
    return out


def make_federation(mods=(), **kw):
    model = build_model("logreg", (6,), 3, seed=0)
    spec = LocalTrainingSpec(epochs=1, lr=0.1, batch_size=16)
    return Federation(model, blobs(), spec, seed=3, update_mods=mods, executor="serial", **kw)


def test_training_reaches_high_accuracy_on_separable_blobs():
    fed = make_federation()
    final = run_rounds(fed, fedavg, get_flat_params(fed.model), num_rounds=5)
    data = fed.client_data[0]
    acc, _ = accuracy_and_loss(fed.model, final, data.x, data.y)
    assert acc > 0.9


def test_round_equals_fedavg_of_plain_local_updates():
    fed = make_federation()
    params = get_flat_params(fed.model)
    record = run_round(fed, fedavg, params, 1, [0, 1, 2, 3])
    ups = [
        local_update(fed.model, params, fed.client_data[c], fed.spec, seed, c)
        for c, seed in [(c, derive_seed(3, "client", 1, c, 0)) for c in range(4)]
    ]
    expected = fedavg(
        torch.stack([u.delta for u in ups]), torch.tensor([float(u.num_samples) for u in ups])
    )
    assert torch.equal(record.aggregate, expected)
    assert torch.equal(record.global_after, params + expected)
    assert record.participants == (0, 1, 2, 3)


def test_nan_and_wrong_shape_updates_are_rejected_not_averaged():
    def corrupt(round_, params, updates):
        out = list(updates)
        out[1] = replace(out[1], delta=torch.full_like(out[1].delta, float("nan")))
        out[2] = replace(out[2], delta=out[2].delta[:-1])
        return out

    fed = make_federation(mods=[corrupt])
    clean = make_federation()
    params = get_flat_params(fed.model)
    record = run_round(fed, fedavg, params, 1, [0, 1, 2, 3])
    assert [r.client_id for r in record.rejected] == [1, 2]
    assert "NaN" in record.rejected[0].reason
    assert "wrong shape" in record.rejected[1].reason
    assert record.participants == (0, 3)
    ref = run_round(clean, fedavg, params, 1, [0, 3])
    assert torch.equal(record.aggregate, ref.aggregate)
    assert torch.isfinite(record.global_after).all()


def test_all_updates_rejected_leaves_model_unchanged():
    def nan_all(round_, params, updates):
        return [replace(u, delta=u.delta * float("inf")) for u in updates]

    fed = make_federation(mods=[nan_all])
    params = get_flat_params(fed.model)
    record = run_round(fed, fedavg, params, 1, [0, 1])
    assert torch.equal(record.global_after, params)
    assert len(record.rejected) == 2


def test_screen_update_accepts_a_clean_update():
    assert screen_update(ClientUpdate(0, torch.zeros(5), 1, 0.0), 5) is None
    assert "dtype" in screen_update(ClientUpdate(0, torch.zeros(5, dtype=torch.int64), 1, 0.0), 5)


@pytest.mark.parametrize(
    ("values", "rejected"),
    [
        ([1.0, float("nan"), 2.0], True),
        ([1.0, float("inf"), 2.0], True),
        ([float("-inf"), 1.0, float("inf")], True),  # the sum is NaN, not inf
        ([3e38, 3e38, -1.0], False),  # finite values whose float32 sum overflows to inf
        ([-3e38, -3e38, 0.0], False),
        ([1e-45, 0.0, -2.5], False),
    ],
)
def test_screening_rejects_exactly_the_updates_with_a_non_finite_value(values, rejected):
    delta = torch.tensor(values, dtype=torch.float32)
    reason = screen_update(ClientUpdate(0, delta, 1, 0.0), 3)
    assert (reason is not None) is rejected
    assert all_finite(delta) is not rejected
    assert all_finite(delta) == bool(torch.isfinite(delta).all())


def test_same_seed_gives_bit_identical_runs_and_other_seed_differs():
    a = run_rounds(
        make_federation(), fedavg, get_flat_params(make_federation().model), num_rounds=3
    )
    b = run_rounds(
        make_federation(), fedavg, get_flat_params(make_federation().model), num_rounds=3
    )
    assert torch.equal(a, b)
    other = make_federation()
    other.seed = 4
    c = run_rounds(other, fedavg, get_flat_params(other.model), num_rounds=3)
    assert not torch.equal(a, c)


def test_resuming_at_any_round_reproduces_the_uninterrupted_run():
    fed = make_federation()
    p0 = get_flat_params(fed.model)
    full = run_rounds(fed, fedavg, p0, num_rounds=4)
    half = run_rounds(fed, fedavg, p0, num_rounds=2)
    resumed = run_rounds(fed, fedavg, half, num_rounds=4, start_round=3)
    assert torch.equal(full, resumed)


def test_sampling_is_seeded_and_respects_fraction():
    ids = list(range(20))
    a = sample_clients(ids, 0.25, seed=1, round_=3)
    assert len(a) == 5
    assert a == sample_clients(ids, 0.25, seed=1, round_=3)
    assert a != sample_clients(ids, 0.25, seed=1, round_=4)
    assert sample_clients(ids, 1.0, 0, 1) == ids
    assert len(sample_clients(ids, 0.01, 0, 1)) == 1
    with pytest.raises(ConfigError):
        sample_clients(ids, 0.0, 0, 1)


def test_partial_participation_uses_sampled_clients_only():
    fed = make_federation()
    seen = []

    class Spy:
        def on_round_end(self, record):
            seen.append(record.participants)

    run_rounds(
        fed, fedavg, get_flat_params(fed.model), num_rounds=3, participation=0.5, observers=[Spy()]
    )
    assert all(len(p) == 2 for p in seen)


def test_unknown_client_is_a_clear_error():
    fed = make_federation()
    with pytest.raises(
        UnknownClientError, match="client\\(s\\) 9 not in this federation \\(client ids 0..3\\)"
    ):
        fed.train(TrainTask(get_flat_params(fed.model), [0, 9], 1))


def test_robust_aggregators_run_in_the_loop():
    for name in ("median", "trimmed_mean", "krum", "multi_krum"):
        fed = make_federation()
        agg = make_aggregator(name, trim=1, krum_f=1)
        final = run_rounds(fed, agg, get_flat_params(fed.model), num_rounds=2)
        assert torch.isfinite(final).all()
