"""Which model a user's Flower app trains: given, found in the app, or the arrays alone.

``Recording`` records a run's model by import path (``model.factory``), so that unlearning can
rebuild its structure. A Flower app need not say which: ``resolve_model``

1. takes ``model=`` when given: an import path ``"pkg.module:name"`` or the object itself (a
   zero-argument ``nn.Module`` class as Flower's quickstart ``Net``, or any factory: a
   function of ``(input_shape, num_classes, **options)`` needs ``input_shape``);
2. else looks for it in the app: the ``nn.Module`` classes of the ServerApp's module (the caller
   of ``Recording.start``) and of the other loaded modules of its package, built without
   arguments; the first (by name) whose parameters and buffers are the initial arrays' keys
   and shapes is the model;
3. else (a NumPy app, or a model built with arguments) keeps the arrays alone: ``arrays_model``
   holds one float32 parameter per array, in the record's order. It cannot run a forward pass;
   unlearning needs none (the methods work on flat vectors, evaluation is the app's
   ``evaluate_fn`` and the clients'), and the unlearned model is saved under the app's own
   array keys.

The class count is the length of the last one-dimensional array (the output layer's bias),
the input shape the one given (else unknown, ``()``): both are informational for a model that
builds without them.
"""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.integrations.flower.app_protocol import ArrayLayout
from fedunlearn.models import federated_buffers
from fedunlearn.runs.components import object_path

ARRAYS_FACTORY = "fedunlearn.integrations.flower.app_model:arrays_model"
_NOT_USER = ("torch", "flwr", "fedunlearn", "numpy", "builtins")


class ArraysModule(nn.Module):
    """A model known only by its arrays: one float32 parameter per array (no forward pass)."""

    def __init__(self, shapes: Iterable[Iterable[int]]) -> None:
        super().__init__()
        self.arrays = nn.ParameterList(
            [nn.Parameter(torch.zeros(*[int(d) for d in s])) for s in shapes]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Refuse: only the app's own model computes outputs."""
        raise ConfigError(
            "this run's model is known by its arrays only (Recording found no model class in "
            "the app); pass model=YourNet to Recording to evaluate it in fedunlearn"
        )


def arrays_model(
    input_shape: tuple[int, ...], num_classes: int, shapes: list[list[int]]
) -> nn.Module:
    """The recorded factory of ``ArraysModule`` (``model.factory`` of an arrays-only run)."""
    return ArraysModule(shapes)


@dataclass(frozen=True)
class ModelChoice:
    """The model a run records, and how it was chosen.

    Attributes:
        path: The recorded factory's import path.
        options: The factory's keyword options.
        input_shape: One example's shape (``()``: unknown).
        num_classes: The class count (0: unknown).
        how: One line: where the model came from.
    """

    path: str
    options: dict[str, Any]
    input_shape: tuple[int, ...]
    num_classes: int
    how: str

    @property
    def arrays_only(self) -> bool:
        """Whether the run knows its model by the arrays alone."""
        return self.path == ARRAYS_FACTORY


def _shapes(record: ArrayRecord) -> dict[str, tuple[int, ...]]:
    return {k: tuple(int(d) for d in record[k].shape) for k in record.keys()}


def _module_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    state = dict(model.named_parameters()) | dict(federated_buffers(model))
    return {n: tuple(t.shape) for n, t in state.items()}


def guess_classes(record: ArrayRecord) -> int:
    """Return the length of the record's last one-dimensional array (0 if none)."""
    last = [s for s in _shapes(record).values() if len(s) == 1]
    return int(last[-1][0]) if last else 0


def _zero_arg(cls: Callable[..., Any]) -> bool:
    try:
        inspect.signature(cls).bind()
    except (TypeError, ValueError):
        return False
    return True


def _candidates(namespaces: Iterable[Mapping[str, Any]]) -> list[type]:
    found: dict[str, type] = {}
    for names in namespaces:
        for value in names.values():
            if (
                isinstance(value, type)
                and issubclass(value, nn.Module)
                and value.__module__.split(".")[0] not in _NOT_USER
                and value.__module__ != "__main__"
                and _zero_arg(value)
            ):
                found.setdefault(object_path(value), value)
    return [found[k] for k in sorted(found)]


def app_namespaces(caller: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Return the caller's globals, then those of the loaded modules of its package."""
    package = str(caller.get("__name__", "")).split(".")[0]
    out: list[Mapping[str, Any]] = [caller]
    if package and package not in _NOT_USER and package != "__main__":
        out += [
            vars(m)
            for name, m in sorted(sys.modules.items())
            if m is not None and (name == package or name.startswith(package + "."))
        ]
    return out


def find_model(record: ArrayRecord, namespaces: Iterable[Mapping[str, Any]]) -> type | None:
    """Return the first zero-argument ``nn.Module`` class whose arrays are ``record``'s."""
    want = _shapes(record)
    for cls in _candidates(namespaces):
        try:
            with torch.random.fork_rng(devices=[]):
                model = cls()
        except Exception:  # noqa: BLE001 - a candidate that does not build is not the model
            continue
        if isinstance(model, nn.Module) and _module_shapes(model) == want:
            return cls
    return None


def resolve_model(
    model: str | Callable[..., nn.Module] | None,
    initial: ArrayRecord,
    *,
    input_shape: tuple[int, ...] | None,
    num_classes: int | None,
    options: Mapping[str, Any] | None,
    namespaces: Iterable[Mapping[str, Any]] = (),
) -> ModelChoice:
    """Return the model the run records (module docstring).

    Raises:
        ConfigError: ``model`` is an object with no import path (a lambda, a local class, a
            class of ``__main__``), or a factory that needs the input shape and none is given.
    """
    classes = int(num_classes) if num_classes is not None else guess_classes(initial)
    shape = tuple(int(d) for d in input_shape) if input_shape is not None else ()
    opts = dict(options or {})
    if model is None:
        found = find_model(initial, namespaces)
        if found is not None:
            path = object_path(found)
            return ModelChoice(path, opts, shape, classes, f"{path} (its arrays match)")
        shapes = [list(s) for s in _shapes(initial).values()]
        return ModelChoice(
            ARRAYS_FACTORY,
            {"shapes": shapes},
            shape,
            classes,
            f"the arrays alone ({len(shapes)} arrays, "
            f"{sum(math.prod(s) for s in shapes):,} values; no model class in the app matches "
            "them: pass model=YourNet to build it)",
        )
    if isinstance(model, str):
        return ModelChoice(model, opts, shape, classes, model)
    path = object_path(model)
    module, _, name = path.partition(":")
    if module == "__main__" or "<" in name:
        raise ConfigError(
            f"model {path!r} has no import path (a lambda, a local class or one of __main__); "
            "define it at the top level of a module of the app, or pass 'pkg.module:name'"
        )
    if input_shape is None and not isinstance(model, type) and not _zero_arg(model):
        try:
            inspect.signature(model).bind(None, None, **opts)
        except (TypeError, ValueError):
            pass
        else:
            raise ConfigError(
                f"model {path!r} is built as {name}(input_shape, num_classes); pass "
                "input_shape=(...) to Recording, or a zero-argument model class"
            )
    return ModelChoice(path, opts, shape, classes, path)


def state_dict_of(record: ArrayRecord) -> dict[str, torch.Tensor]:
    """Return the arrays of ``record`` as a ``state_dict`` (the app's own keys)."""
    return {k: torch.from_numpy(np.array(record[k].numpy(), copy=True)) for k in record.keys()}


def model_layout(model: nn.Module, record: ArrayRecord, path: str) -> ArrayLayout:
    """Return the layout of ``record`` in the model's flat order, checked against the model.

    Raises:
        ConfigError: the record's arrays are not the model's parameters and persistent buffers
            (names and shapes).
    """
    state = dict(model.named_parameters()) | dict(federated_buffers(model))
    order = list(dict(model.named_parameters())) + [n for n, _ in federated_buffers(model)]
    mine = {n: tuple(t.shape) for n, t in state.items()}
    theirs = {k: tuple(int(d) for d in record[k].shape) for k in record.keys()}
    if mine != theirs:
        lacking = sorted(set(mine) - set(theirs))
        extra = sorted(set(theirs) - set(mine))
        shapes = sorted(k for k in set(mine) & set(theirs) if mine[k] != theirs[k])
        raise ConfigError(
            f"model {path!r} does not fit the initial arrays: they must be the same (the model's "
            f"parameters and buffers); missing {lacking[:4]}, extra {extra[:4]}, other shapes "
            f"{[(k, mine[k], theirs[k]) for k in shapes[:3]]}"
        )
    return ArrayLayout.of(record, order)
