"""DPSGDTraining and ClippedTraining check C and set up the vectorised path the same way."""

import math

import pytest
import torch
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.fl.records import ClientData
from fedunlearn.privacy.local_training import ClippedTraining, DPSGDTraining

CLIENTS = {0: ClientData(torch.zeros(4, 3), torch.zeros(4, dtype=torch.int64))}


def _dp(clip_norm, **kwargs):
    return DPSGDTraining(
        nn.Linear(3, 2),
        CLIENTS,
        clip_norm=clip_norm,
        delta=1e-5,
        epsilon_of=lambda r: 1.0,
        **kwargs,
    )


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_a_clip_norm_that_is_not_a_finite_positive_number_is_refused(bad):
    with pytest.raises(ConfigError) as dp_err:
        _dp(bad)
    assert str(dp_err.value) == f"the DP-SGD clip norm C must be a finite number > 0; got {bad}"
    with pytest.raises(ConfigError) as clipped_err:
        ClippedTraining(nn.Linear(3, 2), CLIENTS, clip_norm=bad)
    assert str(clipped_err.value) == f"the clip norm C must be a finite number > 0; got {bad}"


def test_both_train_vectorised_where_the_model_allows_it_unless_told_not_to():
    clipped = ClippedTraining(nn.Linear(3, 2), CLIENTS, clip_norm=1)
    assert clipped.vectorized is not None
    assert clipped.clip_norm == 1.0
    assert isinstance(clipped.clip_norm, float)
    assert clipped.noise_salt == 0
    assert _dp(1.0).vectorized is not None
    assert _dp(1.0, vectorize=False).vectorized is None
    assert _dp(1.0, noise_salt=3).noise_salt == 3
