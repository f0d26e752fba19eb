"""A federation's data as a user gives it: ``FederatedData``, checked once on construction.

A data source named in a config (``data.source: "pkg.module:function"``, called as
``function(num_clients, seed, **data.options)``) or passed to ``train_run(..., data=...)`` /
``UnlearnSession(..., data=...)`` returns the data of the whole federation, already split by
client. It may return a ``FederatedData`` or a plain mapping
``{"clients": {client_id: (x, y)}, "test": (x, y)}`` (optionally ``"held_out"`` and
``"trigger"``, ``"input_shape"``, ``"num_classes"``) of torch tensors or numpy arrays;
``as_federated_data`` turns either into a checked ``FederatedData``.

Conventions (the same as the built-in datasets, ``fedunlearn.data.datasets``): ``x`` is float
(converted to float32) or integer token ids (int64), one example per row, every client and the
test set sharing one example shape; ``y`` is a 1-D integer label vector in
``0..num_classes-1``; client ids are the ints ``0..num_clients-1``. ``num_classes`` is derived
(largest label + 1 over clients and test set) unless given; ``input_shape`` is derived from the
test set's ``x``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from fedunlearn.errors import DataFormatError

__all__ = ["FederatedData", "as_federated_data"]

#: A trigger function: a batch of inputs -> the same batch with the backdoor trigger applied.
TriggerFunction = Callable[[torch.Tensor], torch.Tensor]
_KEYS = ("clients", "test", "held_out", "trigger", "input_shape", "num_classes", "name")


def _tensor(value: Any, where: str) -> torch.Tensor:
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(np.ascontiguousarray(value))
    if not isinstance(value, torch.Tensor):
        raise DataFormatError(
            f"{where} is {type(value).__name__}; give a torch tensor or a numpy array"
        )
    return value.detach().cpu().contiguous()


def _pair(value: Any, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(x, y)`` as checked CPU tensors: x float32 or int64, y int64 of length N."""
    if not isinstance(value, tuple | list) or len(value) != 2:
        raise DataFormatError(
            f"{where} must be a pair (x, y); got {type(value).__name__}"
            + (f" of length {len(value)}" if isinstance(value, tuple | list) else "")
        )
    x, y = _tensor(value[0], f"{where} x"), _tensor(value[1], f"{where} y")
    if x.is_floating_point():
        x = x.to(torch.float32)
        bad = int((~torch.isfinite(x)).sum())
        if bad:  # one NaN input makes that client's every update non-finite (rejected)
            raise DataFormatError(
                f"{where} x holds {bad} NaN or infinite value(s) (after conversion to "
                "float32); clean or impute them before training"
            )
    elif x.dtype in (torch.int32, torch.int64, torch.int16, torch.uint8):
        x = x.to(torch.int64)
    else:
        raise DataFormatError(f"{where} x has dtype {x.dtype}; give float inputs or int token ids")
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise DataFormatError(f"{where} y has dtype {y.dtype}; labels must be integers")
    y = y.to(torch.int64)
    if x.ndim < 2 or y.ndim != 1 or len(x) != len(y):
        raise DataFormatError(
            f"{where}: x has shape {tuple(x.shape)} and y {tuple(y.shape)}; give x of shape "
            "(N, *example_shape) and y of shape (N,)"
        )
    if len(y) == 0:
        raise DataFormatError(f"{where} is empty; every client and the test set need samples")
    return x, y


@dataclass(frozen=True, eq=False, repr=False)
class FederatedData:
    """The data of a whole federation, split by client (checked and converted on construction).

    Attributes:
        clients: Client id (``0..num_clients-1``) -> its training set ``(x, y)``.
        test: The server's test set ``(x, y)``.
        held_out: Optional client id -> a held-out set of that client's distribution, never
            trained on (non-members for membership checks of that client).
        trigger: Optional function stamping the backdoor trigger on a batch of inputs (the
            attack's trigger and the backdoor checks use it instead of the pixel patch).
        input_shape: Shape of one example (derived from ``test`` when None).
        num_classes: Number of classes (largest label + 1 when None).
        name: What to call the data in messages and records.

    Raises:
        DataFormatError: A set is not a pair of tensors/arrays, shapes or dtypes disagree, a
            label is out of range, or a client id is not a non-negative int.
    """

    clients: Mapping[int, tuple[torch.Tensor, torch.Tensor]]
    test: tuple[torch.Tensor, torch.Tensor]
    held_out: Mapping[int, tuple[torch.Tensor, torch.Tensor]] | None = None
    trigger: TriggerFunction | None = None
    input_shape: tuple[int, ...] | None = None
    num_classes: int | None = None
    name: str = "custom"
    _digest: list[str] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        # messages name the data as the caller does ("data.source 'pkg:load'") or by its name
        name = self.name if self.name.startswith(("data", "the data")) else f"data '{self.name}'"
        if not isinstance(self.clients, Mapping) or not self.clients:
            raise DataFormatError(
                f"{name}: clients must be a non-empty mapping client_id -> (x, y); got "
                f"{type(self.clients).__name__}"
            )
        clients = {}
        for cid, pair in self.clients.items():
            if isinstance(cid, bool) or not isinstance(cid, int | np.integer) or cid < 0:
                raise DataFormatError(f"{name}: client id {cid!r} is not a non-negative int")
            clients[int(cid)] = _pair(pair, f"{name} client {cid}")
        test = _pair(self.test, f"{name} test set")
        held = None
        if self.held_out is not None:
            if not isinstance(self.held_out, Mapping):
                raise DataFormatError(
                    f"{name}: held_out must be a mapping client_id -> (x, y); got "
                    f"{type(self.held_out).__name__}"
                )
            held = {}
            for cid, pair in self.held_out.items():
                if cid not in clients:
                    raise DataFormatError(
                        f"{name}: held_out names client {cid!r}, which has no training set"
                    )
                held[int(cid)] = _pair(pair, f"{name} held-out set of client {cid}")
        shape = tuple(test[0].shape[1:]) if self.input_shape is None else self.input_shape
        shape = tuple(int(d) for d in shape)
        labels = [p[1] for p in (*clients.values(), test, *(held or {}).values())]
        top = max(int(y.max()) for y in labels)
        classes = top + 1 if self.num_classes is None else int(self.num_classes)
        for where, (x, y) in [
            *((f"client {c}", p) for c, p in clients.items()),
            ("test set", test),
            *((f"held-out set of client {c}", p) for c, p in (held or {}).items()),
        ]:
            if tuple(x.shape[1:]) != shape:
                raise DataFormatError(
                    f"{name} {where}: examples have shape {tuple(x.shape[1:])}; the "
                    f"federation's input shape is {shape} (every set must share it)"
                )
            if x.dtype != test[0].dtype:
                raise DataFormatError(
                    f"{name} {where}: x is {x.dtype}, the test set's x is {test[0].dtype}"
                )
            if int(y.min()) < 0 or int(y.max()) >= classes:
                raise DataFormatError(
                    f"{name} {where}: labels must lie in 0..{classes - 1}; got "
                    f"{int(y.min())}..{int(y.max())}"
                )
        if classes < 2:
            raise DataFormatError(f"{name}: needs at least 2 classes; got {classes}")
        if self.trigger is not None and not callable(self.trigger):
            raise DataFormatError(
                f"{name}: trigger must be a function x -> x; got {type(self.trigger).__name__}"
            )
        object.__setattr__(self, "clients", MappingProxyType(dict(sorted(clients.items()))))
        object.__setattr__(self, "test", test)
        object.__setattr__(
            self, "held_out", None if held is None else MappingProxyType(dict(sorted(held.items())))
        )
        object.__setattr__(self, "input_shape", shape)
        object.__setattr__(self, "num_classes", classes)

    @property
    def num_clients(self) -> int:
        """Number of clients."""
        return len(self.clients)

    def digest(self) -> str:
        """Return the SHA-256 of every tensor's dtype, shape and bytes, in a fixed order."""
        if not self._digest:
            h = hashlib.sha256()
            sets = [("test", self.test), *((f"c{c}", p) for c, p in self.clients.items())]
            sets += [(f"h{c}", p) for c, p in (self.held_out or {}).items()]
            for key, (x, y) in sets:
                for t in (x, y):
                    h.update(f"{key}:{t.dtype}:{tuple(t.shape)};".encode())
                    h.update(t.numpy().tobytes())
            self._digest.append(h.hexdigest())
        return self._digest[0]

    def __repr__(self) -> str:
        return (
            f"FederatedData(name={self.name!r}, clients={self.num_clients}, "
            f"test={len(self.test[1])}, input_shape={self.input_shape}, "
            f"num_classes={self.num_classes})"
        )


def as_federated_data(value: Any, what: str = "data") -> FederatedData:
    """Return ``value`` (a ``FederatedData`` or a plain mapping) as a checked ``FederatedData``.

    Args:
        value: What a data source returned, or what a caller passed.
        what: How to name the component in messages (``data.source 'pkg.mod:load'``).

    Raises:
        DataFormatError: ``value`` is neither, a mapping lacks ``clients`` or ``test`` or has
            unknown keys, or a set fails ``FederatedData``'s checks; one line naming ``what``.
    """
    if isinstance(value, FederatedData):
        return value
    if not isinstance(value, Mapping):
        raise DataFormatError(
            f"{what} returned {type(value).__name__}; return a fedunlearn.data.FederatedData or "
            'a mapping {"clients": {client_id: (x, y)}, "test": (x, y)}'
        )
    missing = [k for k in ("clients", "test") if k not in value]
    unknown = sorted(str(k) for k in value if k not in _KEYS)
    if missing or unknown:
        raise DataFormatError(
            f"{what} returned a mapping "
            + (f"without {' and '.join(missing)}" if missing else "")
            + ("; " if missing and unknown else "")
            + (f"with unknown keys {', '.join(unknown)}" if unknown else "")
            + f"; allowed keys: {', '.join(_KEYS)}"
        )
    kwargs = dict(value)
    kwargs.setdefault("name", what)
    return FederatedData(**kwargs)
