"""Build a model by name from a dataset's input shape and class count.

``build_model`` also accepts a callable ``(input_shape, num_classes) -> nn.Module`` so any user
``torch.nn.Module`` works with the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fedunlearn.errors import ConfigError, UnknownNameError
from fedunlearn.models.cnn import PaperCNN
from fedunlearn.models.linear import MLP, LogisticRegression
from fedunlearn.models.textcnn import TextCNN

ModelFactory = Callable[..., nn.Module]


def _cnn(input_shape: tuple[int, ...], num_classes: int, **kw: Any) -> nn.Module:
    if len(input_shape) != 3:
        raise ConfigError(f"model 'cnn' needs image input (C, H, W); got shape {input_shape}")
    return PaperCNN(input_shape, num_classes, **kw)  # type: ignore[arg-type]


def _cnn_fmnist(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return _cnn(input_shape, num_classes, extra_hidden=128)


def _textcnn(input_shape: tuple[int, ...], num_classes: int, vocab_size: int = 25002) -> nn.Module:
    return TextCNN(vocab_size, num_classes)


MODELS: dict[str, ModelFactory] = {
    "logreg": LogisticRegression,
    "mlp": MLP,
    "cnn": _cnn,
    "cnn_fmnist": _cnn_fmnist,
    "textcnn": _textcnn,
}


def build_model(
    name: str | ModelFactory,
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    seed: int,
    **options: Any,
) -> nn.Module:
    """Build a freshly initialised model; the same ``seed`` gives the same initial weights.

    Args:
        name: A key of ``MODELS`` or a factory ``(input_shape, num_classes, **options)``.
        input_shape: Shape of one example, e.g. ``(1, 28, 28)``.
        num_classes: Number of output classes.
        seed: Seed of the parameter initialisation (M_0).
        **options: Extra keyword arguments for the factory (``hidden=(128,)`` for ``mlp``,
            ``vocab_size`` for ``textcnn``).

    Raises:
        UnknownNameError: if ``name`` is not registered.
    """
    if isinstance(name, str):
        if name not in MODELS:
            raise UnknownNameError(
                f"unknown model '{name}'; available: {', '.join(sorted(MODELS))}"
            )
        factory = MODELS[name]
    else:
        factory = name
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = factory(tuple(input_shape), num_classes, **options)
    return model
