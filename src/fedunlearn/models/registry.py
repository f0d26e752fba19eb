"""Build a model by name from a dataset's input shape and class count, and say how it was built.

``build_model`` also accepts a callable ``(input_shape, num_classes, **options) -> nn.Module`` so
any user ``torch.nn.Module`` works with the engine. Every model it returns carries its
``ModelSpec`` (registry name or factory, input shape, class count, options; ``model_spec``), which
``fedunlearn.models.export`` writes next to the weights so that a file can rebuild its module.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fedunlearn.errors import ConfigError, UnknownNameError
from fedunlearn.models.cnn import PaperCNN
from fedunlearn.models.linear import MLP, LogisticRegression
from fedunlearn.models.textcnn import TextCNN

ModelFactory = Callable[..., nn.Module]

#: Name of the attribute holding a built model's ``ModelSpec`` (read it with ``model_spec``).
SPEC_ATTRIBUTE = "_fedunlearn_spec"
CUSTOM = "custom"


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


@dataclass(frozen=True)
class ModelSpec:
    """How a model was built: enough to build the same module again.

    Attributes:
        name: A key of ``MODELS``, or ``"custom"`` for a user factory.
        input_shape: Shape of one example, e.g. ``(1, 28, 28)``.
        num_classes: Number of output classes.
        options: The factory's keyword arguments (JSON values: ``{"hidden": [128]}``).
        factory: ``"module:qualname"`` of a user factory (``name == "custom"``); informative
            only: fedunlearn never imports code named in a file.
    """

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    options: Mapping[str, Any] = field(default_factory=dict)
    factory: str | None = None

    def to_json(self) -> str:
        """Return the spec as one JSON object (keys sorted).

        Raises:
            ConfigError: if an option is not a JSON value (then the spec cannot be saved).
        """
        doc = {
            "name": self.name,
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "options": dict(self.options),
            "factory": self.factory,
        }
        try:
            return json.dumps(doc, sort_keys=True)
        except TypeError as err:
            raise ConfigError(
                f"model options {dict(self.options)!r} cannot be saved as JSON ({err}); pass "
                "JSON values (numbers, strings, lists) as model options"
            ) from None

    @classmethod
    def from_json(cls, text: str) -> ModelSpec:
        """Parse ``to_json``'s output.

        Raises:
            ConfigError: if ``text`` is not a model spec.
        """
        try:
            doc = json.loads(text)
            spec = cls(
                name=str(doc["name"]),
                input_shape=tuple(int(d) for d in doc["input_shape"]),
                num_classes=int(doc["num_classes"]),
                options=dict(doc.get("options") or {}),
                factory=doc.get("factory"),
            )
        except (ValueError, TypeError, KeyError) as err:
            raise ConfigError(
                f"not a fedunlearn model spec ({type(err).__name__}: {err}); got {text[:200]!r}"
            ) from None
        return spec


def model_spec(model: nn.Module) -> ModelSpec | None:
    """Return the ``ModelSpec`` that ``build_model`` recorded on ``model`` (None if none)."""
    spec = getattr(model, SPEC_ATTRIBUTE, None)
    return spec if isinstance(spec, ModelSpec) else None


def _factory_name(factory: ModelFactory) -> str:
    module = getattr(factory, "__module__", None) or "?"
    qualname = getattr(factory, "__qualname__", None) or type(factory).__qualname__
    return f"{module}:{qualname}"


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

    Returns:
        The module, carrying its ``ModelSpec`` (``model_spec(model)``).

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
    model = call_factory(factory, input_shape, num_classes, seed=seed, **options)
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"model factory {_factory_name(factory)} returned {type(model).__name__}, not a "
            "torch.nn.Module"
        )
    return attach_spec(model, name, input_shape, num_classes, options)


def call_factory(
    factory: ModelFactory,
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    seed: int,
    **options: Any,
) -> Any:
    """Call ``factory(input_shape, num_classes, **options)`` with torch's CPU RNG at ``seed``.

    A factory that takes no positional arguments (a zero-argument model class, as Flower's
    quickstart ``Net``) is called as ``factory(**options)``; so is one that can be called without
    them when the input shape is unknown (``()``, a run recorded from a Flower app that never
    named it). The caller's RNG state is restored afterwards; what the factory returns is not
    checked.
    """
    args = (tuple(input_shape), num_classes) if _takes_shape(factory, input_shape, options) else ()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return factory(*args, **options)


def _takes_shape(
    factory: ModelFactory, input_shape: tuple[int, ...], options: Mapping[str, Any]
) -> bool:
    """Return whether to pass the shape and class count (module doc of ``call_factory``)."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # no signature to read: call it the documented way
        return True
    try:
        signature.bind(**options)
        bare = True
    except TypeError:
        bare = False
    if bare and not tuple(input_shape):
        return False
    try:
        signature.bind(None, None, **options)
        return True
    except TypeError:
        return not bare  # neither binds: the documented call raises the factory's own error


def attach_spec(
    model: nn.Module,
    name: str | ModelFactory,
    input_shape: tuple[int, ...],
    num_classes: int,
    options: Mapping[str, Any],
) -> nn.Module:
    """Record on ``model`` how it was built (``model_spec`` reads it) and return it."""
    if isinstance(name, str):
        spec = ModelSpec(name, tuple(input_shape), num_classes, dict(options))
    else:
        spec = ModelSpec(
            CUSTOM, tuple(input_shape), num_classes, dict(options), _factory_name(name)
        )
    setattr(model, SPEC_ATTRIBUTE, spec)
    return model
