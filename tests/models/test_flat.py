"""The flat vector: parameters, then persistent buffers (BatchNorm statistics)."""

import copy

import torch
from tests.support.own_components import make_net
from torch import nn

from fedunlearn.fl.aggregators import fedavg
from fedunlearn.fl.client import LocalTrainingSpec, local_update
from fedunlearn.fl.records import ClientData
from fedunlearn.models import (
    build_model,
    get_flat_params,
    num_params,
    num_trainable,
    set_flat_params,
)


def bn_net(seed=0):
    return build_model(make_net, (6,), 3, seed=seed, width=4)


def test_buffer_free_models_keep_the_parameter_only_vector():
    model = build_model("mlp", (1, 8, 8), 10, seed=0, hidden=(16,))
    expected = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert torch.equal(get_flat_params(model), expected)
    assert num_params(model) == num_trainable(model)


def test_batchnorm_statistics_are_the_tail_of_the_vector_and_round_trip():
    # Prepare: move the statistics off their defaults
    model = bn_net()
    model.train()(torch.randn(8, 6))
    flat = get_flat_params(model)

    # Execute
    other = set_flat_params(bn_net(seed=1), flat)

    # Assert
    norm = model.body[1]
    assert num_params(model) == num_trainable(model) + 4 + 4 + 1
    assert torch.equal(flat[-9:-5], norm.running_mean)
    assert torch.equal(flat[-5:-1], norm.running_var)
    assert flat[-1] == 1.0  # num_batches_tracked
    for key, value in model.state_dict().items():
        assert torch.equal(other.state_dict()[key], value), key


def test_integer_buffers_are_rounded_when_written():
    model = bn_net()
    flat = get_flat_params(model)
    flat[-1] = 4.6
    set_flat_params(model, flat)
    assert model.body[1].num_batches_tracked.dtype == torch.int64
    assert int(model.body[1].num_batches_tracked) == 5


def test_non_persistent_buffers_are_not_federated():
    model = nn.Linear(3, 2)
    model.register_buffer("scratch", torch.ones(5), persistent=False)
    assert num_params(model) == 8


def test_local_update_returns_the_change_of_the_statistics_and_fedavg_averages_them():
    # Prepare: two clients with different input means
    model = bn_net()
    start = get_flat_params(model)
    g = torch.Generator().manual_seed(0)
    data = {
        c: ClientData(
            torch.randn(16, 6, generator=g) + 3 * c, torch.randint(0, 3, (16,), generator=g)
        )
        for c in (0, 1)
    }
    spec = LocalTrainingSpec(epochs=1, lr=0.1, batch_size=16)

    # Execute
    updates = [local_update(model, start, data[c], spec, seed=c, client_id=c) for c in (0, 1)]
    reference = copy.deepcopy(model)
    set_flat_params(reference, start).train()
    torch.manual_seed(0)
    reference(data[0].x[torch.randperm(16, generator=torch.Generator().manual_seed(0))])
    aggregate = fedavg(torch.stack([u.delta for u in updates]), torch.tensor([16.0, 16.0]))

    # Assert: client 0's running mean moved exactly as one train-mode forward moves it
    d = num_trainable(model)
    assert torch.allclose(
        updates[0].delta[d : d + 4], reference.body[1].running_mean - start[d : d + 4]
    )
    assert updates[0].delta[-1] == 1.0  # one batch tracked
    # FedAvg: the new statistics are the sample-weighted mean of the clients' statistics
    means = [start[d : d + 4] + u.delta[d : d + 4] for u in updates]
    assert torch.allclose(start[d : d + 4] + aggregate[d : d + 4], (means[0] + means[1]) / 2)
    assert model.body[1].num_batches_tracked == 0  # the template is not touched
