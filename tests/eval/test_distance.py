import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.eval.distance import (
    cosine_similarity,
    l2_distance,
    prediction_agreement,
    relative_distance,
)
from fedunlearn.models import build_model

vectors = st.lists(st.floats(-1e3, 1e3, allow_nan=False, width=32), min_size=1, max_size=20).map(
    lambda v: torch.tensor(v, dtype=torch.float32)
)


def test_l2_and_cosine_match_hand_computed_values():
    a = torch.tensor([1.0, 2.0, 3.0])
    b = torch.tensor([4.0, 6.0, 3.0])

    assert l2_distance(a, b) == 5.0
    assert cosine_similarity(a, b) == pytest.approx(25 / math.sqrt(14 * 61), rel=1e-15)
    assert cosine_similarity(a, -2 * a) == -1.0


def test_distances_accumulate_in_float64():
    rng = np.random.default_rng(0)
    a64, b64 = rng.normal(size=100_000), rng.normal(size=100_000)
    a, b = torch.from_numpy(a64).float(), torch.from_numpy(b64).float()
    a_ref, b_ref = a.double().numpy(), b.double().numpy()

    assert l2_distance(a, b) == pytest.approx(np.linalg.norm(a_ref - b_ref), rel=1e-13)
    expected = a_ref @ b_ref / (np.linalg.norm(a_ref) * np.linalg.norm(b_ref))
    assert cosine_similarity(a, b) == pytest.approx(expected, rel=1e-12)


@settings(max_examples=50, deadline=None)
@given(vectors, st.floats(0.1, 10))
def test_distance_properties(v, scale):
    w = v.flip(0)

    assert l2_distance(v, v) == 0.0
    assert l2_distance(v, w) == l2_distance(w, v)
    assert l2_distance(v, v * 0) <= l2_distance(v, w) + l2_distance(w, v * 0) + 1e-9
    if torch.any(v != 0):
        assert cosine_similarity(v, v * scale) == pytest.approx(1.0, abs=1e-6)
        assert -1.0 <= cosine_similarity(v, w) <= 1.0


def test_mismatched_or_non_flat_vectors_raise_config_error():
    with pytest.raises(ConfigError, match=r"\(3,\) and \(4,\)"):
        l2_distance(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ConfigError, match="1-D"):
        cosine_similarity(torch.zeros(2, 2), torch.zeros(2, 2))
    with pytest.raises(ConfigError):
        relative_distance(torch.zeros(3), torch.zeros(3), torch.zeros(4))


def test_cosine_of_a_zero_vector_is_nan_with_a_warning():
    with pytest.warns(UserWarning, match="zero vector"):
        assert math.isnan(cosine_similarity(torch.zeros(3), torch.ones(3)))


def test_relative_distance_is_the_share_of_the_gap_left():
    original = torch.tensor([0.0, 0.0])
    retrained = torch.tensor([3.0, 4.0])

    assert relative_distance(torch.tensor([0.0, 4.0]), retrained, original) == 0.6
    assert relative_distance(retrained, retrained, original) == 0.0
    assert relative_distance(original, retrained, original) == 1.0


def test_relative_distance_with_zero_gap_is_inf_or_zero_and_warns():
    same = torch.tensor([1.0, 2.0])

    with pytest.warns(UserWarning, match="zero gap"):
        assert relative_distance(torch.tensor([1.0, 3.0]), same, same.clone()) == math.inf
    with pytest.warns(UserWarning, match="zero gap"):
        assert relative_distance(same.clone(), same, same.clone()) == 0.0


def _identity_logreg(bias: tuple[float, float]) -> tuple[nn.Module, torch.Tensor]:
    model = build_model("logreg", (2,), 2, seed=0)
    return model, torch.tensor([1.0, 0.0, 0.0, 1.0, *bias])  # logits = x + bias


def test_prediction_agreement_counts_equal_argmax():
    model, params_a = _identity_logreg((0.0, 0.0))
    _, params_b = _identity_logreg((0.0, 1.0))
    x = torch.tensor([[2.0, 0.0], [0.5, 0.0], [0.0, 2.0], [1.0, 0.5]])
    # argmax a: 0 0 1 0; argmax b (second logit + 1): 0 1 1 1
    before = params_a.clone()

    assert prediction_agreement(model, params_a, params_b, x) == 0.5
    assert prediction_agreement(model, params_a, params_a, x) == 1.0
    assert math.isnan(prediction_agreement(model, params_a, params_b, x[:0]))
    assert torch.equal(params_a, before)
