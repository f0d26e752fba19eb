"""The file ``apply`` reads: an unlearned model and, where the method computed one, its trajectory.

``fedunlearn unlearn --out R.json`` writes ``R.apply.safetensors`` beside the JSON and names it
there with its SHA-256 (``fedunlearn.experiments.lifecycle``); ``fedunlearn apply`` checks the
digest and reads it back with ``read_result_file``. One safetensors file (no pickle: it loads
no code) holds

- ``params``: the unlearned model, the flat float32 parameter vector;
- with a trajectory (``fedunlearn.history.trajectory.Trajectory``), per computed round t:
  ``r{t}.global``, ``r{t}.aggregate`` (if any), ``r{t}.u{client}`` for each update kept and,
  for a sharded run, ``r{t}.s{shard}`` for each shard's model; the rounds' client records and
  scalars, the forgotten set and how many of the run's own rounds the trajectory keeps
  (``kept``, an exact replay's untouched prefix, not copied) are in the metadata (JSON).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from fedunlearn.errors import ConfigError
from fedunlearn.history.spool import Slot, SpooledRound, SpooledRounds, TensorSpool
from fedunlearn.history.store import ClientRecord, RoundEntry
from fedunlearn.history.trajectory import Trajectory
from fedunlearn.models.export import write_safetensors

__all__ = ["ResultFile", "file_sha256", "read_result_file", "tensor_sha256", "write_result_file"]

_FORMAT = "fedunlearn-apply"


def tensor_sha256(tensor: torch.Tensor) -> str:
    """Return the SHA-256 of a model's float32 bytes (what an event records)."""
    data = tensor.detach().to(torch.float32).cpu().contiguous().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: str | Path) -> str:
    """Return the SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class ResultFile:
    """What an apply file holds: the model and the trajectory (None if the method had none)."""

    params: torch.Tensor
    trajectory: Trajectory | None


_F32 = "F32"  # safetensors' name of float32


def _sources(
    params: torch.Tensor, trajectory: Trajectory | None
) -> dict[str, torch.Tensor | tuple[TensorSpool, Slot]]:
    """Name -> tensor, or its slot in the trajectory's spool (not read into memory)."""
    out: dict[str, torch.Tensor | tuple[TensorSpool, Slot]] = {
        "params": params.detach().to(torch.float32).cpu()
    }
    if trajectory is None:
        return out
    rounds = trajectory.rounds
    if isinstance(rounds, SpooledRounds):
        for head in rounds.heads:
            for key, slot in _round_tensors(head):
                out[key] = (rounds.spool, slot)
    else:
        for entry in rounds:
            for key, tensor in _round_tensors(entry):
                out[key] = tensor.detach().cpu()
    return out


def _round_tensors(entry: RoundEntry | SpooledRound) -> list[tuple[str, Any]]:
    """One round's tensors (or slots) under their file names."""
    t = entry.round
    named: list[tuple[str, Any]] = [(f"r{t}.global", entry.global_model)]
    if entry.aggregate is not None:
        named.append((f"r{t}.aggregate", entry.aggregate))
    named += [(f"r{t}.u{cid}", delta) for cid, delta in entry.updates.items()]
    named += [(f"r{t}.s{shard}", model) for shard, model in entry.shard_models.items()]
    return named


def _round_meta(entry: RoundEntry | SpooledRound) -> dict[str, Any]:
    return {
        "round": entry.round,
        "scalars": dict(entry.scalars),
        "clients": [
            {
                "client_id": c.client_id,
                "status": c.status,
                "num_samples": c.num_samples,
                "norm": c.norm,
                "loss": c.loss,
                "reason": c.reason,
                "scalars": dict(c.scalars),
            }
            for c in entry.clients
        ],
    }


def _stream_safetensors(
    tmp: str, sources: dict[str, torch.Tensor | tuple[TensorSpool, Slot]], meta: dict[str, str]
) -> None:
    """Write a float32 safetensors file one tensor at a time, as ``save_file`` lays it out.

    The data in name order (safetensors sorts by dtype, then name; all are float32 here), the
    header JSON with the metadata first and sorted (``models.export.write_safetensors``'s
    canonical form) padded with spaces to a multiple of 8 bytes: the same bytes
    ``safetensors.torch.save_file`` and the canonical header give (a test compares them).
    """
    header: dict[str, Any] = {"__metadata__": dict(sorted(meta.items()))}
    offset = 0
    for name in sorted(sources):
        source = sources[name]
        if isinstance(source, tuple):
            shape, size = list(source[1].shape), source[1].nbytes
        else:
            shape, size = list(source.shape), source.numel() * 4
        header[name] = {"dtype": _F32, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    with open(tmp, "wb") as fh:
        fh.write(len(text).to_bytes(8, "little"))
        fh.write(text)
        for name in sorted(sources):
            source = sources[name]
            if isinstance(source, tuple):
                spool, slot = source
                for chunk in spool.chunks(slot):
                    fh.write(chunk)
            else:
                fh.write(source.contiguous().reshape(-1).numpy().data)


def _all_float32(sources: dict[str, torch.Tensor | tuple[TensorSpool, Slot]]) -> bool:
    return all(
        (s[1].dtype if isinstance(s, tuple) else s.dtype) == torch.float32 for s in sources.values()
    )


def write_result_file(path: str | Path, params: torch.Tensor, trajectory: Trajectory | None) -> str:
    """Write the model (and trajectory) to ``path``; return the file's SHA-256.

    Atomically, with the same bytes for the same content (``models.export.write_safetensors``).
    The tensors are written one at a time, a spooled trajectory's copied from its file
    (``history.spool``), so writing holds one tensor in memory, not the trajectory.

    Raises:
        OSError: The file cannot be written (e.g. no space left); nothing is left under ``path``.
    """
    sources = _sources(params, trajectory)
    rounds = [] if trajectory is None else trajectory.rounds
    heads = rounds.heads if isinstance(rounds, SpooledRounds) else rounds
    meta = {
        "format": _FORMAT,
        "trajectory": json.dumps(
            None
            if trajectory is None
            else {
                "forgotten": sorted(trajectory.forgotten),
                "rounds": [_round_meta(entry) for entry in heads],
                "kept": trajectory.kept,
            }
        ),
    }
    if _all_float32(sources):
        write_safetensors(path, lambda tmp: _stream_safetensors(tmp, sources, meta))
    else:  # any other dtype: safetensors orders mixed dtypes its own way
        tensors = {
            k: (v[0].get(v[1]) if isinstance(v, tuple) else v.clone()).contiguous()
            for k, v in sources.items()
        }
        write_safetensors(path, lambda tmp: save_file(tensors, tmp, metadata=meta))
    return file_sha256(path)


def read_result_file(path: str | Path) -> ResultFile:
    """Read an apply file back.

    Raises:
        ConfigError: Not an apply file, or its contents do not form a trajectory.
    """
    path = Path(path)
    try:
        tensors = load_file(str(path))
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
    except (SafetensorError, OSError) as err:
        raise ConfigError(f"{path}: not a readable apply file ({err})") from None
    if meta.get("format") != _FORMAT or "params" not in tensors:
        raise ConfigError(
            f"{path}: not a fedunlearn apply file (written by 'fedunlearn unlearn --out')"
        )
    spec = json.loads(meta.get("trajectory", "null"))
    if spec is None:
        return ResultFile(tensors["params"], None)
    entries = []
    for row in spec["rounds"]:
        t = row["round"]
        prefix, shard_prefix = f"r{t}.u", f"r{t}.s"
        updates = {int(k[len(prefix) :]): v for k, v in tensors.items() if k.startswith(prefix)}
        shards = {
            int(k[len(shard_prefix) :]): v for k, v in tensors.items() if k.startswith(shard_prefix)
        }
        entries.append(
            RoundEntry(
                round=t,
                global_model=tensors[f"r{t}.global"],
                aggregate=tensors.get(f"r{t}.aggregate"),
                updates=updates,
                clients=[ClientRecord(**c) for c in row["clients"]],
                scalars=row["scalars"],
                shard_models=shards,
            )
        )
    trajectory = Trajectory(
        tuple(entries), frozenset(spec["forgotten"]), kept=int(spec.get("kept", 0))
    )
    return ResultFile(tensors["params"], trajectory)
