"""Review of issue 23: a user data source with NaN or infinite inputs fails in one line.

``as_federated_data`` checked shapes, dtypes, label ranges and empty clients, but accepted NaN
and infinite features: a client holding one NaN then uploads non-finite updates every round
(rejected by the screen), so the run trained without it and said nothing about its data.
"""

import numpy as np
import pytest
from tests.support.own_components import load

from fedunlearn.data import as_federated_data
from fedunlearn.errors import DataFormatError


@pytest.mark.parametrize(
    ("part", "value", "where"),
    [("client", np.nan, "client 0"), ("test", np.inf, "test"), ("client", 1e39, "client 0")],
)
def test_non_finite_inputs_are_refused_in_one_line(part, value, where):
    data = load(3, 0, per_client=8)
    x = (data["clients"][0] if part == "client" else data["test"])[0].astype(np.float64)
    x[1, 2] = value  # 1e39 overflows float32
    if part == "client":
        data["clients"][0] = (x, data["clients"][0][1])
    else:
        data["test"] = (x, data["test"][1])

    with pytest.raises(DataFormatError, match="1 NaN or infinite value") as err:
        as_federated_data(data)

    assert where in str(err.value)
    assert "\n" not in str(err.value)


def test_finite_inputs_still_pass():
    assert as_federated_data(load(3, 0, per_client=8)).num_classes == 3
