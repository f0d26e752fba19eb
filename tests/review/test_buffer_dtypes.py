"""Review of issue 23: a user model's buffers must round-trip the flat vector bit for bit.

The flat vector carries persistent buffers as float32 (``models/flat.py``, docs/models.md).
``check_model`` refused non-float32 *parameters* in one line, but a float64 buffer (a user's
own running statistic kept in double precision) was accepted and silently rounded to float32
on every round trip: the stored and exported model was not the trained one.
"""

import pytest
import torch
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.models import get_flat_params, set_flat_params
from fedunlearn.runs.user import check_model


class DoubleStat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.register_buffer("scale", torch.tensor([0.1, 1 / 3], dtype=torch.float64))

    def forward(self, x):
        return self.fc(x) * self.scale[0].float()


def test_a_float64_buffer_would_not_survive_the_flat_vector():
    net = DoubleStat()
    before = net.scale.clone()
    set_flat_params(net, get_flat_params(net))
    assert not torch.equal(net.scale, before)  # why the check below is needed


def test_a_float64_buffer_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="buffer 'scale' is torch.float64") as err:
        check_model(DoubleStat(), "model.factory 'x:y'", 3, torch.zeros(2, 4))
    assert "\n" not in str(err.value)


def test_float32_and_integer_buffers_pass():
    net = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))  # num_batches_tracked: int64
    check_model(net, "model.factory 'x:y'", 3, torch.zeros(2, 4))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    set_flat_params(net, get_flat_params(net))
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
