"""Models in plain torch, built by name, plus flat-vector parameter access."""

from fedunlearn.models.flat import get_flat_params, num_params, set_flat_params
from fedunlearn.models.registry import MODELS, build_model

__all__ = ["MODELS", "build_model", "get_flat_params", "num_params", "set_flat_params"]
