"""Build a run's model and data from user components, checking them before any training.

``user_data`` calls the config's ``data.source`` (``function(num_clients, seed, **options)``)
or takes a data object passed in, and checks it: a ``FederatedData`` or the plain mapping
(``fedunlearn.data.federated``), client ids exactly ``0..num_clients-1``. ``user_model``
calls the factory (``function(input_shape, num_classes, **options) -> nn.Module``) under the
run's model seed and checks what it returns: a module with float32 parameters whose output on
two test inputs has shape ``(2, num_classes)``. Every failure is one ``ConfigError`` line naming
the component and what was wrong. Both return the component's record
(``fedunlearn.runs.components.component_record``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fedunlearn.config import RunConfig
from fedunlearn.data import FederatedData, as_federated_data
from fedunlearn.errors import ConfigError, DataFormatError
from fedunlearn.fl.seeding import derive_seed
from fedunlearn.models import build_model, federated_buffers
from fedunlearn.models.registry import ModelFactory, attach_spec, call_factory
from fedunlearn.runs.components import component_record, load_component, object_path

__all__ = ["FunctionTrigger", "UserData", "user_data", "user_model"]


@dataclass(frozen=True)
class FunctionTrigger:
    """A user's trigger function seen as the attack's trigger (``apply(x) -> x``)."""

    function: Callable[[torch.Tensor], torch.Tensor]

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``function(x)``, checked to keep ``x``'s shape and dtype.

        Raises:
            ConfigError: The function returns something else.
        """
        out = self.function(x.clone())
        if not isinstance(out, torch.Tensor) or out.shape != x.shape or out.dtype != x.dtype:
            got = (
                f"{out.dtype} {tuple(out.shape)}"
                if isinstance(out, torch.Tensor)
                else type(out).__name__
            )
            raise ConfigError(
                f"data trigger {object_path(self.function)} returned {got}; it must return a "
                f"tensor like its input ({x.dtype} {tuple(x.shape)})"
            )
        return out


@dataclass(frozen=True)
class UserData:
    """The checked data of a user component, how to name it, and its record."""

    data: FederatedData
    what: str
    record: dict[str, Any]


def user_data(config: RunConfig, data: FederatedData | Mapping[str, Any] | None) -> UserData:
    """Return the federation's data from ``data``, else from the config's ``data.source``.

    Raises:
        ConfigError: The source cannot be resolved or raises, or its result is not the
            federation's data for ``data.num_clients`` clients (one line naming the source).
    """
    n = config.data.num_clients
    source: Callable[..., Any] | None = None
    if data is not None:
        what = "the data passed in"
        value: Any = data
    else:
        path = str(config.data.source)
        what = f"data.source {path!r}"
        source = load_component(path, "data.source")
        try:
            value = source(n, config.seed, **config.data.options)
        except Exception as err:
            raise ConfigError(f"{what} raised {type(err).__name__}: {err}") from None
    try:
        checked = as_federated_data(value, what)
    except DataFormatError as err:
        raise ConfigError(str(err) if str(err).startswith(what) else f"{what}: {err}") from None
    ids = sorted(checked.clients)
    if ids != list(range(n)):
        shown = f"{ids[0]}..{ids[-1]}" if ids == list(range(ids[0], ids[-1] + 1)) else str(ids)
        raise ConfigError(
            f"{what} returned clients {shown} ({len(ids)} of them); data.num_clients is {n}, so "
            f"it must return clients 0..{n - 1}"
        )
    record = component_record(
        source,
        config.data.source if data is None else None,
        data_sha256=checked.digest(),
        input_shape=list(checked.input_shape or ()),
        num_classes=checked.num_classes,
    )
    return UserData(checked, what, record)


def user_model(
    config: RunConfig,
    factory: ModelFactory | None,
    input_shape: tuple[int, ...],
    num_classes: int,
    probe: torch.Tensor | None,
) -> tuple[nn.Module, dict[str, Any]]:
    """Build the run's model with ``factory``, else the config's ``model.factory``; check it.

    Args:
        config: The run's config (seed, ``model.factory``, ``model.options``).
        factory: A factory passed in (wins over the config's).
        input_shape: Shape of one example.
        num_classes: Number of classes.
        probe: Test inputs; the output on two of them must have shape ``(2, num_classes)``
            (None: not checked, for a run without server-side data).

    Returns:
        The module (carrying its ``ModelSpec``) and the component's record.

    Raises:
        ConfigError: The factory cannot be resolved, raises, returns no ``nn.Module``, has
            non-float32 or no parameters, or its output does not fit (one line naming it).
    """
    if factory is not None:
        path = object_path(factory)
        options: dict[str, Any] = {}
    else:
        path = str(config.model.factory)
        factory = load_component(path, "model.factory")
        options = dict(config.model.options)
    what = f"model.factory {path!r}"
    try:
        net: Any = call_factory(
            factory, input_shape, num_classes, seed=derive_seed(config.seed, "model"), **options
        )
    except Exception as err:
        raise ConfigError(f"{what} raised {type(err).__name__}: {err}") from None
    check_model(net, what, num_classes, probe)
    attach_spec(net, factory, input_shape, num_classes, options)
    record = component_record(
        factory,
        config.model.factory if path == config.model.factory else path,
        input_shape=list(input_shape),
        num_classes=num_classes,
        options=options,
    )
    return net, record


def model_from_record(
    config: RunConfig, recorded: Mapping[str, Any], factory: ModelFactory | None
) -> tuple[nn.Module, dict[str, Any]]:
    """Build the model of a run without server-side data at its recorded shape and classes.

    Args:
        config: The run's config.
        recorded: The store's ``components`` (``model`` or ``data`` holds ``input_shape`` and
            ``num_classes``).
        factory: A factory passed in; else the config's ``model.factory`` or ``model.name``.

    Raises:
        ConfigError: The record lacks the shape or class count, or the factory fails.
    """
    entry = {**(recorded.get("data") or {}), **(recorded.get("model") or {})}
    if "input_shape" not in entry or "num_classes" not in entry:
        raise ConfigError(
            "the run records no input_shape and num_classes of its model (store metadata "
            "components.model); it cannot be rebuilt without the clients' data"
        )
    shape = tuple(int(d) for d in entry["input_shape"])
    classes = int(entry["num_classes"])
    if factory is None and config.model.factory is None:
        options: dict[str, Any] = {"hidden": tuple(config.model.hidden)}
        if config.model.name != "mlp":
            options = {}
        net = build_model(
            config.model.name, shape, classes, seed=derive_seed(config.seed, "model"), **options
        )
        return net, {"path": None, "input_shape": list(shape), "num_classes": classes}
    return user_model(config, factory, shape, classes, None)


def check_model(net: Any, what: str, num_classes: int, probe: torch.Tensor | None) -> None:
    """Raise one ``ConfigError`` line if ``net`` cannot be the run's model.

    Raises:
        ConfigError: Not an ``nn.Module``, no or non-float32 parameters, a floating buffer
            that is not float32, or the output on two
            ``probe`` inputs does not have shape ``(2, num_classes)``.
    """
    if not isinstance(net, nn.Module):
        raise ConfigError(f"{what} returned {type(net).__name__}, not a torch.nn.Module")
    params = list(net.named_parameters())
    if not params:
        raise ConfigError(f"{what} returned a module without trainable parameters")
    for name, p in params:
        if p.dtype != torch.float32:
            raise ConfigError(
                f"{what}: parameter '{name}' is {p.dtype}; fedunlearn trains float32 models "
                "(return module.float())"
            )
    for name, b in federated_buffers(net):  # carried in the float32 flat vector (models/flat.py)
        if b.is_floating_point() and b.dtype != torch.float32:
            raise ConfigError(
                f"{what}: buffer '{name}' is {b.dtype}; the flat float32 vector that stores and "
                "aggregates models would round it (keep float32 or integer buffers)"
            )
    if probe is None:
        return
    x = probe[:2]
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            out = copy.deepcopy(net).eval()(x)
    except Exception as err:
        raise ConfigError(
            f"{what}: its forward on inputs of shape {tuple(x.shape)} raised "
            f"{type(err).__name__}: {err}"
        ) from None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (len(x), num_classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError(
            f"{what}: output on {len(x)} inputs has shape {got}; the data has {num_classes} "
            f"classes, so it must be ({len(x)}, {num_classes}) logits"
        )
