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

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from fedunlearn.errors import ConfigError
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


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Copy each tensor whose storage an earlier one uses (safetensors refuses shared memory).

    A trajectory round that trained nobody keeps the previous round's global model (the same
    tensor); only such repeats are copied, not the whole trajectory.
    """
    seen: set[int] = set()
    out = {}
    for key, tensor in tensors.items():
        ptr = tensor.untyped_storage().data_ptr()
        out[key] = tensor.clone() if ptr in seen else tensor
        seen.add(ptr)
    return out


def write_result_file(path: str | Path, params: torch.Tensor, trajectory: Trajectory | None) -> str:
    """Write the model (and trajectory) to ``path``; return the file's SHA-256.

    Atomically, with the same bytes for the same content (``models.export.write_safetensors``).

    Raises:
        OSError: The file cannot be written (e.g. no space left); nothing is left under ``path``.
    """
    # a copy: the model is often the trajectory's last global model (safetensors refuses
    # tensors that share memory)
    tensors: dict[str, torch.Tensor] = {"params": params.detach().to(torch.float32).cpu().clone()}
    rounds = []
    if trajectory is not None:
        for entry in trajectory.rounds:
            t = entry.round
            assert entry.global_model is not None  # Trajectory checks it
            tensors[f"r{t}.global"] = entry.global_model.detach().cpu()
            if entry.aggregate is not None:
                tensors[f"r{t}.aggregate"] = entry.aggregate.detach().cpu()
            for cid, delta in entry.updates.items():
                tensors[f"r{t}.u{cid}"] = delta.detach().cpu()
            for shard, model in entry.shard_models.items():
                tensors[f"r{t}.s{shard}"] = model.detach().cpu()
            rounds.append(
                {
                    "round": t,
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
            )
    meta = {
        "format": _FORMAT,
        "trajectory": json.dumps(
            None
            if trajectory is None
            else {
                "forgotten": sorted(trajectory.forgotten),
                "rounds": rounds,
                "kept": trajectory.kept,
            }
        ),
    }
    tensors = _unshared({k: v.contiguous() for k, v in tensors.items()})
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
