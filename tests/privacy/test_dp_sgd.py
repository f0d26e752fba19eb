"""DP-SGD local training: the vectorised path against the per-client reference, the reference
against a plain torch.optim.SGD loop, Poisson sampling, the noise scale and the round hook."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from fedunlearn.errors import ConfigError, UnknownClientError
from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.clients import TrainTask
from fedunlearn.fl.federation import Federation
from fedunlearn.fl.records import ClientData, ClientUpdate
from fedunlearn.models import build_model, get_flat_params
from fedunlearn.models.flat import set_flat_params
from fedunlearn.privacy.accountant import SampledGaussian, calibrate_sampled_gaussian, rdp_epsilon
from fedunlearn.privacy.dp_sgd import (
    batch_generator,
    dp_sgd_update,
    num_steps,
    poisson_batches,
    sample_rate,
)
from fedunlearn.privacy.dp_sgd_vectorized import VectorizedDPSGD
from fedunlearn.privacy.local_training import DPSGDTraining


def make_clients(sizes: list[int], seed: int = 0) -> dict[int, ClientData]:
    g = torch.Generator().manual_seed(seed)
    return {
        c: ClientData(
            torch.rand((n, 1, 8, 8), generator=g), torch.randint(0, 10, (n,), generator=g)
        )
        for c, n in enumerate(sizes)
    }


SPEC = LocalTrainingSpec(epochs=2, lr=0.2, batch_size=8, momentum=0.5, weight_decay=1e-3)


def _mlp(seed: int = 0) -> nn.Module:
    return build_model("mlp", (1, 8, 8), 10, seed=seed, hidden=(12,))


@pytest.mark.parametrize(
    "spec", [SPEC, LocalTrainingSpec(epochs=2, lr=0.2, batch_size=8)], ids=["momentum", "plain"]
)
def test_vectorized_dp_sgd_equals_the_per_client_reference(spec):
    model = _mlp()
    clients = make_clients([30, 45, 0, 9, 61])  # unequal sizes, an empty client, n <= B
    start = get_flat_params(model) + 0.01
    tasks = [(cid, 100 + cid) for cid in clients]
    # a small budget forces several chunks of clients
    fast = VectorizedDPSGD(model, clients, max_chunk_bytes=60_000)
    assert fast._chunk_size(spec) < len(tasks)
    results = fast.run(start, tasks, spec, clip_norm=0.4, noise_multiplier=0.8)
    again = fast.run(start, tasks, spec, clip_norm=0.4, noise_multiplier=0.8)
    for (cid, seed), (update, noise), (update2, _) in zip(tasks, results, again, strict=True):
        ref, ref_noise = dp_sgd_update(
            model,
            start,
            clients[cid],
            spec,
            clip_norm=0.4,
            noise_multiplier=0.8,
            seed=seed,
            client_id=cid,
        )
        assert update.client_id == cid
        assert update.num_samples == len(clients[cid])
        assert torch.allclose(update.delta, ref.delta, atol=1e-6), cid
        assert torch.equal(update.delta, update2.delta)  # bit-identical rerun
        assert torch.allclose(noise.noise_delta, ref_noise.noise_delta, atol=1e-6)
        assert torch.allclose(noise.norms, ref_noise.norms, rtol=1e-5)
        if len(clients[cid]):
            assert update.train_loss == pytest.approx(ref.train_loss, rel=1e-5)
            assert float(update.delta.norm()) > 0
        else:
            assert float(update.delta.abs().max()) == 0
            assert math.isnan(update.train_loss)


def test_noise_drawn_on_several_threads_equals_noise_drawn_in_turn():
    model = _mlp(seed=1)
    clients = make_clients([30, 20, 25])
    fast = VectorizedDPSGD(model, clients)
    start, tasks = get_flat_params(model), [(c, 50 + c) for c in clients]
    one = fast.run(start, tasks, SPEC, clip_norm=0.5, noise_multiplier=1.0)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        three = fast.run(start, tasks, SPEC, clip_norm=0.5, noise_multiplier=1.0)
        assert fast._pool is not None
    finally:
        torch.set_num_threads(threads)
        fast.close()
    for (u1, n1), (u3, n3) in zip(one, three, strict=True):
        assert torch.equal(n1.noise_delta, n3.noise_delta)  # the same draws, bit for bit
        assert torch.allclose(u1.delta, u3.delta, atol=1e-6)


def test_reference_without_noise_or_clipping_is_sgd_on_the_poisson_batches():
    model = _mlp(seed=2)
    data = make_clients([40])[0]
    start = get_flat_params(model)
    seed = 7
    ours, noise = dp_sgd_update(
        model, start, data, SPEC, clip_norm=1e9, noise_multiplier=0.0, seed=seed
    )
    # independent reference: torch.optim.SGD on the same batches, loss = sum / (q n)
    local = set_flat_params(_mlp(seed=2), start)
    opt = torch.optim.SGD(
        local.parameters(), lr=SPEC.lr, momentum=SPEC.momentum, weight_decay=SPEC.weight_decay
    )
    expected = sample_rate(40, SPEC.batch_size) * 40
    for idx in poisson_batches(40, SPEC, batch_generator(seed)):
        opt.zero_grad()
        (F.cross_entropy(local(data.x[idx]), data.y[idx], reduction="sum") / expected).backward()
        opt.step()
    assert torch.allclose(ours.delta, get_flat_params(local) - start, atol=1e-6)
    assert float(noise.noise_delta.abs().max()) == 0


def test_poisson_batches_have_the_expected_size_and_count_and_follow_the_seed():
    spec = LocalTrainingSpec(epochs=3, lr=0.1, batch_size=64)
    batches = poisson_batches(3000, spec, batch_generator(1))
    assert len(batches) == num_steps(3000, spec) == math.ceil(3 * 3000 / 64)
    sizes = torch.tensor([len(b) for b in batches], dtype=torch.float64)
    # Binomial(3000, 64/3000): mean 64, sd ~7.9; 141 steps -> the mean is within 4 sd / sqrt(141)
    assert abs(float(sizes.mean()) - 64) < 4 * 7.9 / math.sqrt(len(batches))
    assert float(sizes.std()) == pytest.approx(
        math.sqrt(3000 * (64 / 3000) * (1 - 64 / 3000)), rel=0.25
    )
    again = poisson_batches(3000, spec, batch_generator(1))
    assert all(torch.equal(a, b) for a, b in zip(batches, again, strict=True))
    assert not torch.equal(batches[0], poisson_batches(3000, spec, batch_generator(2))[0])
    assert num_steps(40, spec) == 3
    assert sample_rate(40, 64) == 1.0  # n <= B: full batches
    assert all(len(b) == 40 for b in poisson_batches(40, spec, batch_generator(3)))


def test_noise_has_the_calibrated_scale():
    # With C -> 0 the clipped signal vanishes and the delta is the noise alone:
    # per coordinate, lr * sigma * C / (q n) * sqrt(steps) without momentum or weight decay.
    spec = LocalTrainingSpec(epochs=2, lr=0.5, batch_size=10)
    model = _mlp(seed=4)
    data = make_clients([50])[0]
    clip_norm, sigma = 1e-3, 3.0
    update, noise = dp_sgd_update(
        model,
        get_flat_params(model),
        data,
        spec,
        clip_norm=clip_norm,
        noise_multiplier=sigma,
        seed=11,
    )
    steps = num_steps(50, spec)
    expected_std = spec.lr * sigma * clip_norm / 10 * math.sqrt(steps)
    assert float(update.delta.std()) == pytest.approx(expected_std, rel=0.05)
    signal = update.delta - noise.noise_delta
    assert float(signal.norm()) <= spec.lr * clip_norm * 50 / 10 * steps  # |sum clip g| <= m C


def test_round_hook_calibrates_sigma_records_the_ledger_and_plugs_into_the_federation():
    model = _mlp()
    clients = make_clients([40, 40, 60])
    spec = LocalTrainingSpec(epochs=1, lr=0.2, batch_size=10)
    training = DPSGDTraining(model, clients, clip_norm=0.5, delta=1e-5, epsilon_of=lambda r: 2.0)
    assert training.vectorized is not None  # all-linear model: one vmap over the clients
    fed = Federation(model, clients, spec, seed=3, executor="serial", local_training=training)
    updates = fed.train(TrainTask(get_flat_params(model), [0, 1, 2], 1))
    stats = training.stats[1]
    # accounted event: the largest q (smallest client) and the most steps (largest client)
    assert stats.sample_rate == pytest.approx(10 / 40)
    assert stats.steps == math.ceil(60 / 10)
    assert stats.noise_multiplier == calibrate_sampled_gaussian(0.25, 6, 2.0, 1e-5)
    assert stats.epsilon_achieved == pytest.approx(
        rdp_epsilon(SampledGaussian(stats.noise_multiplier, 0.25, 6).event(), 1e-5)
    )
    assert stats.epsilon_achieved <= 2.0
    assert stats.epsilon_achieved == pytest.approx(2.0, rel=1e-3)
    assert stats.round_epsilon_pld < stats.epsilon_achieved
    assert 0 <= stats.clipped_fraction <= 1
    assert stats.raw_norm_median > 0
    assert stats.noise_to_signal > 0
    assert stats.noise_std == stats.noise_multiplier * 0.5
    serial = DPSGDTraining(
        model, clients, clip_norm=0.5, delta=1e-5, epsilon_of=lambda r: 2.0, vectorize=False
    )
    reference = serial.run(get_flat_params(model), fed_tasks(fed, [0, 1, 2], 1), spec, 1)
    for a, b in zip(updates, reference, strict=True):
        assert torch.allclose(a.delta, b.delta, atol=1e-6)
    assert serial.stats[1].noise_to_signal == pytest.approx(stats.noise_to_signal, rel=1e-4)


def fed_tasks(fed: Federation, ids: list[int], round_: int) -> list[tuple[int, int]]:
    from fedunlearn.fl.seeding import derive_seed

    return [(cid, derive_seed(fed.seed, "client", round_, cid, 0)) for cid in ids]


class Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(1, 2, 3)
        self.head = nn.Linear(2 * 3 * 3, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.max_pool2d(torch.relu(self.conv(x)), 2).flatten(1))


class Scaled(nn.Module):
    """A parameter outside Linear/Conv2d layers: only the reference path can train it."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.scale * x.flatten(1))


def test_conv_models_train_vectorized_like_the_per_client_reference():
    # the paper's CNN takes this path: conv layers by per-example unfolded gradients
    clients = make_clients([30, 11, 0])
    start = get_flat_params(Conv()) + 0.01
    tasks = [(cid, 10 + cid) for cid in clients]
    fast = VectorizedDPSGD(Conv(), clients, max_chunk_bytes=50_000)
    assert fast._chunk_size(SPEC) < len(tasks)  # several chunks
    results = fast.run(start, tasks, SPEC, clip_norm=0.7, noise_multiplier=0.9)
    for (cid, seed), (update, noise) in zip(tasks, results, strict=True):
        ref, ref_noise = dp_sgd_update(
            Conv(), start, clients[cid], SPEC, clip_norm=0.7, noise_multiplier=0.9, seed=seed
        )
        assert torch.allclose(update.delta, ref.delta, atol=1e-6), cid
        assert torch.allclose(noise.norms, ref_noise.norms, rtol=1e-5)
    training = DPSGDTraining(Conv(), clients, clip_norm=1.0, delta=1e-5, epsilon_of=lambda r: 3.0)
    assert training.vectorized is not None


def test_other_models_train_client_by_client_and_bad_input_is_refused():
    clients = make_clients([20, 25])
    training = DPSGDTraining(Scaled(), clients, clip_norm=1.0, delta=1e-5, epsilon_of=lambda r: 3.0)
    assert training.vectorized is None
    spec = LocalTrainingSpec(epochs=1, lr=0.1, batch_size=10)
    out = training.run(get_flat_params(Scaled()), [(0, 1), (1, 2)], spec, 1)
    assert [u.client_id for u in out] == [0, 1]
    assert all(torch.isfinite(u.delta).all() for u in out)
    with pytest.raises(ConfigError, match="every parameter inside an nn.Linear or nn.Conv2d"):
        DPSGDTraining(
            Scaled(), clients, clip_norm=1.0, delta=1e-5, epsilon_of=lambda r: 3.0, vectorize=True
        )
    with pytest.raises(ConfigError, match="clip norm C must be a finite number > 0; got 0.0"):
        DPSGDTraining(_mlp(), clients, clip_norm=0.0, delta=1e-5, epsilon_of=lambda r: 3.0)
    with pytest.raises(UnknownClientError, match="client\\(s\\) 9"):
        training.run(get_flat_params(Scaled()), [(9, 1)], spec, 2)


def test_federation_hands_the_round_to_the_local_training_then_runs_the_mods():
    calls = []

    class Recording:
        name = "recording"

        def run(self, global_params, tasks, spec, round_):
            calls.append((tuple(tasks), spec, round_))
            return [ClientUpdate(cid, torch.ones_like(global_params), 1, 0.0) for cid, _ in tasks]

        def close(self):
            calls.append("closed")

    def halve(round_, global_params, updates):
        return [ClientUpdate(u.client_id, u.delta / 2, 1, 0.0) for u in updates]

    model = _mlp()
    fed = Federation(
        model, make_clients([5, 5]), SPEC, seed=1, update_mods=[halve], local_training=Recording()
    )
    other = LocalTrainingSpec(epochs=3)
    out = fed.train(TrainTask(get_flat_params(model), [1, 0], 7, spec=other))
    assert [u.client_id for u in out] == [1, 0]
    assert float(out[0].delta[0]) == 0.5
    ((tasks, spec, round_),) = calls
    assert [cid for cid, _ in tasks] == [1, 0]
    assert spec is other
    assert round_ == 7
    fed.close()
    assert calls[-1] == "closed"
