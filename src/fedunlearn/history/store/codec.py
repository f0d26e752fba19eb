"""How a tensor is laid out in a payload row: dtype name, JSON shape, raw bytes, CRC-32.

``encode`` gives a zero-copy byte view of a tensor; ``decode`` checks a row's dtype, shape,
size and CRC-32 before rebuilding the tensor, and raises ``PayloadError`` saying what is wrong
(the store turns it into ``HistoryCorruptError`` naming the file, round and client). Floats
that go into SQLite REAL columns pass through ``to_real``/``from_real`` (SQLite turns NaN into
NULL, so NaN goes in as text).
"""

from __future__ import annotations

import json
import math
import zlib

import torch

__all__ = [
    "DTYPES",
    "NO_CLIENT",
    "PayloadError",
    "decode",
    "encode",
    "from_real",
    "shard_key",
    "to_real",
]

NO_CLIENT = -1  # client_id of the payloads that belong to no client (global model, aggregate)


def shard_key(shard: int) -> int:
    """Return the ``client_id`` column value of shard ``shard``'s model (kind ``global``).

    A sharded run stores each shard's model of a round as a ``global`` payload keyed by a
    negative id below ``NO_CLIENT`` (-2 - shard), so no query for a client's updates (ids >= 0)
    or for the run's model (``NO_CLIENT``) ever sees it.
    """
    return -2 - int(shard)


DTYPES = {
    name: getattr(torch, name)
    for name in (
        "float64 float32 float16 bfloat16 complex128 complex64 int64 int32 int16 int8 "
        "uint64 uint32 uint16 uint8 bool"
    ).split()
    if hasattr(torch, name)
}


class PayloadError(ValueError):
    """A payload row is damaged; the message says how."""


def to_real(value: float | None) -> float | str | None:
    """Return ``value`` for a REAL column; SQLite turns NaN into NULL, so NaN goes in as text."""
    return "nan" if value is not None and math.isnan(value) else value


def from_real(value: float | str | None) -> float | None:
    """Undo ``to_real``."""
    return None if value is None else float(value)


def encode(tensor: torch.Tensor) -> tuple[str, str, memoryview, torch.Tensor]:
    """Return dtype name, JSON shape, a zero-copy byte view and the tensor keeping it alive."""
    flat = tensor.detach().cpu().resolve_conj().resolve_neg().contiguous().reshape(-1)
    raw = flat.view(torch.uint8)
    return (
        str(tensor.dtype).removeprefix("torch."),
        json.dumps(list(tensor.shape)),
        memoryview(raw.numpy()),  # type: ignore[arg-type]  # numpy declares __buffer__ for 3.12+ only
        raw,
    )


def decode(dtype_name: str, shape_json: str, size: int, crc: int, data: object) -> torch.Tensor:
    """Return the tensor of a payload row after checking dtype, shape, size and CRC-32.

    Raises:
        PayloadError: saying what does not match.
    """
    dtype = DTYPES.get(dtype_name)
    try:
        shape = tuple(json.loads(shape_json))
    except ValueError:
        shape = None
    if dtype is None or shape is None:
        raise PayloadError(f"has an unreadable dtype/shape ({dtype_name!r}, {shape_json!r})")
    if not isinstance(data, bytes) or len(data) != size:
        got = len(data) if isinstance(data, bytes) else "no"
        raise PayloadError(f"has {got} bytes, not {size}")
    if zlib.crc32(data) != crc:
        raise PayloadError("fails its checksum")
    if math.prod(shape) * dtype.itemsize != size:
        raise PayloadError(f"has {size} bytes, which does not fit dtype {dtype_name} shape {shape}")
    if size == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)
