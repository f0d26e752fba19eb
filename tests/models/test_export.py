"""Model files: safetensors state_dicts with the model spec; bit-exact round trips."""

import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.models import (
    MODELS,
    ModelSpec,
    build_model,
    get_flat_params,
    load_model,
    model_spec,
    num_params,
    read_metadata,
    read_spec,
    save_model,
)

BUILT_IN = {
    "logreg": ((1, 8, 8), {}),
    "mlp": ((1, 8, 8), {"hidden": (32, 16)}),
    "cnn": ((1, 28, 28), {}),
    "cnn_fmnist": ((1, 28, 28), {}),
    "textcnn": ((20,), {"vocab_size": 50}),
}


class NormNet(nn.Module):
    """A user module with a BatchNorm: float buffers and an int64 one."""

    def __init__(self, input_shape, num_classes, width=6):
        super().__init__()
        self.encode = nn.Linear(input_shape[-1], width)
        self.norm = nn.BatchNorm1d(width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.head(torch.relu(self.norm(self.encode(x))))


def test_every_built_in_model_is_covered():
    assert set(BUILT_IN) == set(MODELS)


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_built_in_model_round_trips_bit_exactly(tmp_path, name):
    # Prepare: a trained-looking flat vector (not the initialisation)
    shape, options = BUILT_IN[name]
    template = build_model(name, shape, 4, seed=3, **options)
    flat = torch.randn(num_params(template), generator=torch.Generator().manual_seed(1))

    # Execute
    path = save_model(tmp_path / f"{name}.safetensors", template, params=flat)
    loaded = load_model(path)

    # Assert: same module type, same spec, same bits; the template is untouched
    assert type(loaded) is type(template)
    assert torch.equal(get_flat_params(loaded), flat)
    assert not torch.equal(get_flat_params(template), flat)
    assert model_spec(loaded).to_json() == model_spec(template).to_json()
    assert read_spec(path).name == name
    assert not loaded.training


def test_file_is_a_plain_state_dict_with_the_spec_in_its_metadata(tmp_path):
    model = build_model("mlp", (1, 8, 8), 10, seed=0, hidden=(16,))
    path = save_model(tmp_path / "m.safetensors", model, metadata={"fedunlearn.source": "{}"})

    tensors = load_file(str(path))
    assert sorted(tensors) == sorted(model.state_dict())
    for key, value in model.state_dict().items():
        assert torch.equal(tensors[key], value)
    meta = read_metadata(path)
    assert meta["fedunlearn.format"] == "fedunlearn.model.v1"
    assert meta["fedunlearn.source"] == "{}"
    spec = json.loads(meta["fedunlearn.spec"])
    assert spec == {
        "name": "mlp",
        "input_shape": [1, 8, 8],
        "num_classes": 10,
        "options": {"hidden": [16]},
        "factory": None,
    }


def test_user_module_with_buffers_round_trips(tmp_path):
    # Prepare: train-mode forward passes move the BatchNorm statistics off their defaults; the
    # flat vector carries parameters then buffers (models/flat.py), so a stored model's
    # statistics travel with it
    model = build_model(NormNet, (5,), 3, seed=0, width=6)
    model(torch.randn(8, 5))
    model(torch.randn(8, 5))
    flat = get_flat_params(model)
    flat[:-1] += torch.randn(num_params(model) - 1, generator=torch.Generator().manual_seed(2))
    flat[-1] = 7.0  # num_batches_tracked

    # Execute
    path = save_model(tmp_path / "norm.safetensors", model, params=flat)
    with pytest.raises(ConfigError, match="factory=") as err:
        load_model(path)
    loaded = load_model(path, factory=NormNet)
    into = load_model(path, model=NormNet((5,), 3, width=6))

    # Assert
    assert "test_export:NormNet" in str(err.value)  # the file names the factory it came from
    assert read_spec(path).options == {"width": 6}
    for other in (loaded, into):
        assert torch.equal(get_flat_params(other), flat)
        running = dict(other.named_buffers())["norm.running_mean"]
        assert not torch.equal(running, model.norm.running_mean)  # from the vector, not model
    assert int(loaded.norm.num_batches_tracked) == 7


def test_tied_parameters_stay_tied_after_loading(tmp_path):
    class Tied(nn.Module):
        def __init__(self, input_shape, num_classes):
            super().__init__()
            self.embed = nn.Embedding(7, num_classes)
            self.out = nn.Linear(num_classes, 7, bias=False)
            self.out.weight = self.embed.weight

        def forward(self, x):
            return self.out(self.embed(x))

    model = build_model(Tied, (3,), 4, seed=0)
    path = save_model(tmp_path / "t.safetensors", model)
    loaded = load_model(path, factory=Tied)
    assert loaded.out.weight is loaded.embed.weight
    assert torch.equal(loaded.embed.weight, model.embed.weight)


def test_wrong_module_is_refused_with_the_tensor_names(tmp_path):
    model = build_model("mlp", (1, 8, 8), 10, seed=0, hidden=(16,))
    path = save_model(tmp_path / "m.safetensors", model)

    with pytest.raises(ConfigError, match="does not fit MLP"):
        load_model(path, model=build_model("mlp", (1, 8, 8), 10, seed=0, hidden=(8,)))
    with pytest.raises(ConfigError, match="unexpected tensors"):
        load_model(path, model=build_model("logreg", (1, 8, 8), 10, seed=0))


def test_missing_or_foreign_files_give_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_model(tmp_path / "nope.safetensors")
    junk = tmp_path / "flat.pt"
    torch.save(torch.zeros(3), junk)
    with pytest.raises(ConfigError, match="not a safetensors model file"):
        load_model(junk)
    # a safetensors file from elsewhere has no spec: fill a module the caller provides
    model = build_model("logreg", (1, 8, 8), 10, seed=0)
    from safetensors.torch import save_file

    save_file(model.state_dict(), str(tmp_path / "plain.safetensors"))
    with pytest.raises(ConfigError, match="no fedunlearn model spec"):
        load_model(tmp_path / "plain.safetensors")
    fresh = build_model("logreg", (1, 8, 8), 10, seed=9)
    loaded = load_model(tmp_path / "plain.safetensors", model=fresh)
    assert torch.equal(get_flat_params(loaded), get_flat_params(model))


def test_bad_params_and_metadata_are_refused_and_nothing_is_written(tmp_path):
    model = build_model("logreg", (1, 8, 8), 10, seed=0)
    path = tmp_path / "m.safetensors"
    with pytest.raises(ConfigError, match="needs \\(650,\\)"):
        save_model(path, model, params=torch.zeros(3))
    with pytest.raises(ConfigError, match="strings to strings"):
        save_model(path, model, metadata={"round": 3})
    assert list(tmp_path.iterdir()) == []


def test_spec_json_round_trip_and_rejects_garbage():
    spec = ModelSpec("mlp", (1, 8, 8), 10, {"hidden": [4]})
    assert ModelSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ConfigError, match="not a fedunlearn model spec"):
        ModelSpec.from_json('{"name": "mlp"}')
    with pytest.raises(ConfigError, match="cannot be saved as JSON"):
        ModelSpec("custom", (3,), 2, {"act": object()}).to_json()
