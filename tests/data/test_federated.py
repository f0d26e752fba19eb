"""FederatedData: a federation's data as a user gives it, checked and converted once."""

import numpy as np
import pytest
import torch

from fedunlearn.data import FederatedData, as_federated_data
from fedunlearn.errors import DataFormatError


def arrays(n, features=3, label=0, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, features)), np.full(n, label, dtype=np.int32)


def test_a_plain_mapping_of_numpy_arrays_becomes_float32_and_int64_tensors():
    data = as_federated_data({"clients": {0: arrays(4), 1: arrays(5, label=2)}, "test": arrays(3)})
    x, y = data.clients[1]
    assert x.dtype == torch.float32
    assert y.dtype == torch.int64
    assert data.input_shape == (3,)
    assert data.num_classes == 3
    assert data.num_clients == 2
    assert data.held_out is None
    assert data.trigger is None


def test_the_digest_follows_the_tensors():
    a = as_federated_data({"clients": {0: arrays(4)}, "test": arrays(3, label=1)})
    same = as_federated_data({"clients": {0: arrays(4)}, "test": arrays(3, label=1)})
    other = as_federated_data({"clients": {0: arrays(4, seed=1)}, "test": arrays(3, label=1)})
    assert a.digest() == same.digest() != other.digest()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"clients": {0: arrays(4)}}, "without test"),
        ({"clients": {0: arrays(4)}, "test": arrays(3), "extra": 1}, "unknown keys extra"),
        ({"clients": {"a": arrays(4)}, "test": arrays(3, label=1)}, "client id 'a' is not"),
        ({"clients": {0: arrays(4, features=2)}, "test": arrays(3, label=1)}, "shape \\(2,\\)"),
        ({"clients": {0: ([1.0], [0])}, "test": arrays(3, label=1)}, "torch tensor or a numpy"),
        ({"clients": {0: arrays(4)}, "test": arrays(3, label=1), "num_classes": 1}, "0..0"),
        ({"clients": {0: arrays(4)}, "test": arrays(3), "held_out": {5: arrays(2)}}, "client 5"),
        ("not data", "returned str"),
    ],
)
def test_bad_data_is_refused_in_one_line_naming_it(value, message):
    with pytest.raises(DataFormatError, match=message) as err:
        as_federated_data(value, "data.source 'pkg:load'")
    assert "\n" not in str(err.value)
    assert "pkg:load" in str(err.value)


def test_a_federated_data_is_returned_as_is():
    data = FederatedData(clients={0: arrays(4)}, test=arrays(2, label=1))
    assert as_federated_data(data) is data
