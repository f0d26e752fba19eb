"""The stacked client data of the vectorised executor and of vectorised DP-SGD (one helper)."""

import pytest
import torch
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.fl.records import ClientData
from fedunlearn.fl.vectorized import VectorizedExecutor, stack_clients
from fedunlearn.privacy.dp_sgd_vectorized import VectorizedDPSGD


def _client(n, features=3, label=0):
    return ClientData(
        torch.arange(n * features, dtype=torch.float32).view(n, features),
        torch.full((n,), label, dtype=torch.int32),
    )


def test_rows_offsets_and_sizes_follow_the_clients_order():
    x, y, offsets, sizes = stack_clients({7: _client(2, label=1), 3: _client(3, label=2)})
    assert offsets == {7: 0, 3: 2}
    assert sizes == {7: 2, 3: 3}
    assert x.shape == (5, 3)
    assert x.is_contiguous()
    assert y.dtype == torch.int64
    assert y.tolist() == [1, 1, 2, 2, 2]


def test_clients_without_rows_keep_one_zero_row_for_padding():
    x, y, offsets, sizes = stack_clients({0: _client(0), 1: _client(0)})
    assert x.shape == (1, 3)
    assert float(x.abs().sum()) == 0.0
    assert y.tolist() == [0]
    assert offsets == {0: 0, 1: 0}
    assert sizes == {0: 0, 1: 0}


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: VectorizedExecutor(nn.Linear(3, 2), {}),
            "client_data is empty; the vectorized executor needs at least one client",
        ),
        (
            lambda: VectorizedDPSGD(nn.Linear(3, 2), {}),
            "client_data is empty; DP-SGD needs at least one client",
        ),
    ],
)
def test_no_clients_is_refused_naming_the_user(build, message):
    with pytest.raises(ConfigError) as err:
        build()
    assert str(err.value) == message


def test_clients_of_different_example_shapes_are_refused():
    clients = {0: _client(2, features=3), 1: _client(2, features=4)}
    for build in (
        lambda: VectorizedExecutor(nn.Linear(3, 2), clients),
        lambda: VectorizedDPSGD(nn.Linear(3, 2), clients),
    ):
        with pytest.raises(ConfigError, match=r"share one example shape and dtype.*\(3,\), \(4,\)"):
            build()
