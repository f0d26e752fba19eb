"""Models in plain torch built by name, their flat vector (parameters, buffers), model files."""

from fedunlearn.models.export import load_model, read_metadata, read_spec, save_model
from fedunlearn.models.flat import (
    federated_buffers,
    get_flat_params,
    num_params,
    num_trainable,
    set_flat_params,
)
from fedunlearn.models.registry import MODELS, ModelSpec, build_model, model_spec

__all__ = [
    "MODELS",
    "ModelSpec",
    "build_model",
    "federated_buffers",
    "get_flat_params",
    "load_model",
    "model_spec",
    "num_params",
    "num_trainable",
    "read_metadata",
    "read_spec",
    "save_model",
    "set_flat_params",
]
