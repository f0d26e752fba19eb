"""Models in plain torch, built by name, flat-vector parameter access, and model files."""

from fedunlearn.models.export import load_model, read_metadata, read_spec, save_model
from fedunlearn.models.flat import get_flat_params, num_params, set_flat_params
from fedunlearn.models.registry import MODELS, ModelSpec, build_model, model_spec

__all__ = [
    "MODELS",
    "ModelSpec",
    "build_model",
    "get_flat_params",
    "load_model",
    "model_spec",
    "num_params",
    "read_metadata",
    "read_spec",
    "save_model",
    "set_flat_params",
]
