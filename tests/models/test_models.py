import pytest
import torch
from torch import nn

from fedunlearn.errors import ConfigError, UnknownNameError
from fedunlearn.models import build_model, get_flat_params, num_params, set_flat_params


@pytest.mark.parametrize(
    ("name", "shape", "expected"),
    [
        ("cnn", (1, 28, 28), 582_026),  # paper CNN on MNIST
        ("cnn", (3, 32, 32), 878_538),  # CIFAR-10 variant, 1600-wide flatten
        ("cnn_fmnist", (1, 28, 28), 582_026 - 5130 + 512 * 128 + 128 + 128 * 10 + 10),
        ("mlp", (1, 28, 28), 784 * 128 + 128 + 128 * 10 + 10),
        ("logreg", (1, 8, 8), 64 * 10 + 10),
    ],
)
def test_parameter_counts_match_the_papers(name, shape, expected):
    model = build_model(name, shape, 10, seed=0)
    assert num_params(model) == expected
    assert model(torch.zeros(2, *shape)).shape == (2, 10)


def test_textcnn_classifies_token_batches():
    model = build_model("textcnn", (64,), 4, seed=0, vocab_size=100)
    tokens = torch.randint(0, 100, (3, 64))
    assert model(tokens).shape == (3, 4)
    assert model.fc.in_features == 300


def test_same_seed_same_initial_model_and_global_rng_untouched():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = get_flat_params(build_model("mlp", (1, 8, 8), 10, seed=5))
    assert torch.equal(torch.rand(1), before)
    b = get_flat_params(build_model("mlp", (1, 8, 8), 10, seed=5))
    c = get_flat_params(build_model("mlp", (1, 8, 8), 10, seed=6))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_flat_round_trip_and_size_check():
    model = build_model("cnn", (1, 28, 28), 10, seed=0)
    flat = torch.randn(num_params(model))
    set_flat_params(model, flat)
    assert torch.equal(get_flat_params(model), flat)
    with pytest.raises(ConfigError, match="needs \\(582026,\\)"):
        set_flat_params(model, flat[:-1])


def test_user_module_factory_is_accepted():
    def factory(input_shape, num_classes):
        return nn.Sequential(nn.Flatten(), nn.Linear(16, num_classes))

    model = build_model(factory, (1, 4, 4), 3, seed=0)
    assert num_params(model) == 16 * 3 + 3


def test_unknown_model_lists_choices():
    with pytest.raises(UnknownNameError, match="available: cnn, cnn_fmnist, logreg, mlp"):
        build_model("resnet", (1, 8, 8), 10, seed=0)
