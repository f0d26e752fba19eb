"""What the store keeps, as values: ``RoundEntry``, ``ClientRecord``, ``ForgetRecord``.

Each value checks its fields on construction (types, ranges, consistency), so a malformed
round is refused before anything is written. ``StoreCheck`` is what ``HistoryStore.check()``
found.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from fedunlearn.errors import ConfigError
from fedunlearn.fl.records import UpdateStatus
from fedunlearn.history.store.codec import DTYPES

__all__ = [
    "ClientRecord",
    "ForgetRecord",
    "RoundEntry",
    "Scalar",
    "StoreCheck",
    "check_int",
    "check_tensor",
    "format_ids",
]

Scalar = bool | int | float | str | None


def format_ids(ids: Iterable[int]) -> str:
    """Return ids for a message: ``3..9`` for a run, else up to 30 of them."""
    ids = sorted(set(ids))
    if not ids:
        return "none"
    if len(ids) > 2 and ids[-1] - ids[0] == len(ids) - 1:
        return f"{ids[0]}..{ids[-1]}"
    shown = ", ".join(map(str, ids[:30]))
    return shown + (f", ... ({len(ids)} ids)" if len(ids) > 30 else "")


def check_int(value: object, name: str, minimum: int = 0) -> int:
    """Return ``value`` as an int >= ``minimum``, or raise ``ConfigError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ConfigError(f"{name} must be an int >= {minimum}; got {value!r}.")
    return int(value)


def check_float(value: object, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{name} must be a float or None; got {value!r}.")
    return float(value)


def check_scalars(values: Mapping[str, Any], name: str) -> dict[str, Scalar]:
    if not isinstance(values, Mapping):
        raise ConfigError(f"{name} must be a dict of str to scalar; got {type(values).__name__}.")
    out: dict[str, Scalar] = {}
    for key, value in values.items():
        if not isinstance(key, str):
            raise ConfigError(f"{name} keys must be str; got {key!r}.")
        if value is None or isinstance(value, bool | str):
            out[key] = value
        elif isinstance(value, numbers.Integral):
            out[key] = int(value)
        elif isinstance(value, numbers.Real):
            out[key] = float(value)
        else:
            raise ConfigError(
                f"{name}[{key!r}] must be an int, float, str, bool or None; got "
                f"{type(value).__name__}. Convert tensors with .item()."
            )
    return out


def check_tensor(value: object, name: str) -> torch.Tensor:
    """Return ``value`` if it is a dense tensor of a storable dtype, else raise ``ConfigError``."""
    if not isinstance(value, torch.Tensor):
        raise ConfigError(f"{name} must be a torch.Tensor; got {type(value).__name__}.")
    if value.layout != torch.strided:
        raise ConfigError(f"{name} must be a dense tensor; got layout {value.layout}.")
    if str(value.dtype).removeprefix("torch.") not in DTYPES:
        raise ConfigError(f"{name} has dtype {value.dtype}; storable: {', '.join(DTYPES)}.")
    return value


@dataclass(frozen=True)
class ClientRecord:
    """What happened to one sampled client in one round.

    Attributes:
        client_id: The client's id (>= 0).
        status: ``"accepted"``, ``"rejected"`` or ``"missing"`` (an ``UpdateStatus`` is accepted).
        num_samples: Local training-set size the client reported (0 if it did not reply).
        norm: L2 norm of its update, if computed.
        loss: Its local training loss, if reported.
        reason: Why it was rejected or is missing, if known.
        scalars: Any other per-client numbers (str keys, scalar values).
        stored: Whether the store holds this client's update for the round. Set by the store
            when reading; ignored when writing.
    """

    client_id: int
    status: str
    num_samples: int = 0
    norm: float | None = None
    loss: float | None = None
    reason: str | None = None
    scalars: Mapping[str, Scalar] = field(default_factory=dict)
    stored: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "client_id", check_int(self.client_id, "ClientRecord.client_id"))
        allowed = [s.value for s in UpdateStatus]
        status = str(getattr(self.status, "value", self.status))  # UpdateStatus or str
        if status not in allowed:
            raise ConfigError(
                f"ClientRecord.status for client {self.client_id} must be one of "
                f"{', '.join(allowed)}; got {self.status!r}."
            )
        set_(self, "status", status)
        set_(self, "num_samples", check_int(self.num_samples, "ClientRecord.num_samples"))
        set_(self, "norm", check_float(self.norm, "ClientRecord.norm"))
        set_(self, "loss", check_float(self.loss, "ClientRecord.loss"))
        if self.reason is not None and not isinstance(self.reason, str):
            raise ConfigError(f"ClientRecord.reason must be a str or None; got {self.reason!r}.")
        set_(self, "scalars", check_scalars(self.scalars, "ClientRecord.scalars"))


@dataclass(frozen=True, eq=False)
class RoundEntry:
    """Everything the store keeps for one round; ``write_round`` commits it as one unit.

    Attributes:
        round: Round number; 0 is the initial model and holds ``global_model`` (M_0) only.
        global_model: M_round, the global model after the round, or None to not keep it.
        aggregate: The round's aggregated delta, or None.
        updates: Client id -> update delta to keep; every id needs a record in ``clients``
            whose status is not ``"missing"``.
        clients: One record per sampled client, including those not stored.
        scalars: Round metrics (str keys; int, float, str, bool or None values).
        shard_models: Shard -> its model after the round (a sharded run, whose
            ``global_model`` is their combination); empty otherwise.
    """

    round: int
    global_model: torch.Tensor | None = None
    aggregate: torch.Tensor | None = None
    updates: Mapping[int, torch.Tensor] = field(default_factory=dict)
    clients: Sequence[ClientRecord] = ()
    scalars: Mapping[str, Scalar] = field(default_factory=dict)
    shard_models: Mapping[int, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        r = check_int(self.round, "RoundEntry.round")
        set_(self, "round", r)
        if r == 0 and (
            self.global_model is None or self.updates or self.clients or self.aggregate is not None
        ):
            raise ConfigError(
                "round 0 holds the initial model M_0 only: give global_model and no aggregate, "
                "updates or clients."
            )
        for kind in ("global_model", "aggregate"):
            if getattr(self, kind) is not None:
                check_tensor(getattr(self, kind), f"round {r} {kind}")
        if not isinstance(self.updates, Mapping):
            raise ConfigError(f"round {r} updates must be a dict of client id to tensor.")
        updates = {
            check_int(cid, f"round {r} update key"): check_tensor(u, f"round {r} client {cid}")
            for cid, u in self.updates.items()
        }
        set_(self, "updates", MappingProxyType(updates))
        clients = tuple(self.clients)
        ids = [c.client_id for c in clients if isinstance(c, ClientRecord)]
        if len(ids) != len(clients):
            raise ConfigError(f"round {r}: clients must all be ClientRecord instances.")
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            raise ConfigError(f"round {r}: clients {dup} have more than one ClientRecord.")
        set_(self, "clients", clients)
        status = {c.client_id: c.status for c in clients}
        for cid in updates:
            if status.get(cid, "missing") == "missing":
                raise ConfigError(
                    f"round {r}: an update is given for client {cid}, which has "
                    f"{'status missing' if cid in status else 'no ClientRecord'}; add a record "
                    "with status accepted or rejected."
                )
        set_(self, "scalars", check_scalars(self.scalars, f"round {r} scalars"))
        shards = {
            check_int(s, f"round {r} shard"): check_tensor(t, f"round {r} shard {s} model")
            for s, t in dict(self.shard_models).items()
        }
        set_(self, "shard_models", MappingProxyType(shards))


@dataclass(frozen=True)
class ForgetRecord:
    """One client's entry in the store's log of ``forget()`` calls."""

    client_id: int
    forgotten_at: float  # Unix time, seconds
    size_bytes: int  # payload bytes deleted by that call
    num_payloads: int


@dataclass(frozen=True)
class StoreCheck:
    """Result of ``HistoryStore.check()``: is the store whole, and if not, where it breaks.

    Attributes:
        ok: Nothing wrong was found.
        full: Every payload's checksum was read (``check(full=True)``); otherwise the catalog,
            the metadata and the models only.
        payloads_checked: Payloads whose checksum was verified.
        bytes_checked: Their tensor bytes.
        problems: One line per problem, first bad round first.
        first_bad_round: The earliest round with a damaged or inconsistent entry, or None if
            the damage is not tied to a round (or there is none).
        chain: The committed history's check (``ChainCheck.to_dict()``), or None if not run.
    """

    ok: bool
    full: bool
    payloads_checked: int
    bytes_checked: int
    problems: tuple[str, ...] = ()
    first_bad_round: int | None = None
    chain: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {
            "ok": self.ok,
            "full": self.full,
            "payloads_checked": self.payloads_checked,
            "bytes_checked": self.bytes_checked,
            "first_bad_round": self.first_bad_round,
            "problems": list(self.problems),
            "chain": self.chain,
        }
