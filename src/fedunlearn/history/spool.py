"""Trajectory rounds kept on disk: a method's new history without holding it in memory.

A method that computes a new history (Retrain, FedEraser, FedRecover, Crab) produces, per round,
the global model, the aggregate and the updates it aggregated: (2 + n_t) d float32 values a
round, about 1 GB for 200 rounds of 10 clients of a 101,770-parameter MLP. Only the apply file
needs them all, and it is written after the method ends (docs/lifecycle.md). So
``unlearn.trajectory_log.TrajectoryLog`` appends each round's tensors to a ``TensorSpool`` (an
unnamed temporary file, gone when it is closed or the process ends) as the method computes
them, and keeps in memory only each round's records and where its tensors lie
(``SpooledRound``). ``SpooledRounds`` is the sequence of ``RoundEntry`` the ``Trajectory``
holds: each access reads that round's tensors back (bit for bit what was written), so a reader
holds one round at a time; ``history.result_file`` copies the bytes from the spool to the apply
file without building tensors at all.

The file lies in the system's temporary folder (``TMPDIR``); a full disk fails the method with
an ``OSError`` naming the file, as a full disk does on any write.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import overload

import torch

from fedunlearn.history.store import ClientRecord, RoundEntry, Scalar

__all__ = ["Slot", "SpooledRound", "SpooledRounds", "TensorSpool"]

_CHUNK = 1 << 22  # bytes copied per read when streaming a slot to another file


@dataclass(frozen=True)
class Slot:
    """Where one tensor lies in a spool: byte offset, byte count, dtype and shape."""

    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


class TensorSpool:
    """Tensors appended to an unnamed temporary file and read back on demand.

    Args:
        directory: Folder for the file (default: the system's temporary folder).
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self._file = tempfile.TemporaryFile(prefix="fedunlearn-trajectory-", dir=directory)
        self._end = 0

    @property
    def nbytes(self) -> int:
        """Bytes written so far."""
        return self._end

    def put(self, tensor: torch.Tensor) -> Slot:
        """Append ``tensor``'s bytes; return where they lie.

        Raises:
            OSError: The write failed (e.g. no space left on the device).
        """
        data = tensor.detach().cpu().contiguous()
        view = data.reshape(-1).view(torch.uint8).numpy().data
        fd, done = self._file.fileno(), 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], self._end + done)
        slot = Slot(self._end, len(view), data.dtype, tuple(data.shape))
        self._end += len(view)
        return slot

    def get(self, slot: Slot) -> torch.Tensor:
        """Read the tensor at ``slot`` back (a new tensor with its own memory)."""
        if slot.nbytes == 0:
            return torch.empty(slot.shape, dtype=slot.dtype)
        buffer = bytearray(slot.nbytes)
        self._read_into(memoryview(buffer), slot.offset)
        return torch.frombuffer(buffer, dtype=slot.dtype).reshape(slot.shape)

    def chunks(self, slot: Slot) -> Iterator[memoryview]:
        """Yield ``slot``'s bytes in pieces of at most 4 MiB (for copying to another file)."""
        buffer = bytearray(min(slot.nbytes, _CHUNK))
        done = 0
        while done < slot.nbytes:
            size = min(len(buffer), slot.nbytes - done)
            view = memoryview(buffer)[:size]
            self._read_into(view, slot.offset + done)
            yield view
            done += size

    def _read_into(self, view: memoryview, offset: int) -> None:
        fd, done = self._file.fileno(), 0
        while done < len(view):
            got = os.preadv(fd, [view[done:]], offset + done)
            if got <= 0:
                raise OSError(f"trajectory spool: {len(view) - done} byte(s) missing at {offset}")
            done += got

    def close(self) -> None:
        """Delete the file (its rounds can no longer be read)."""
        self._file.close()


@dataclass(frozen=True)
class SpooledRound:
    """One round whose tensors lie in a spool: its records in memory, its tensors' slots.

    Attributes mirror ``RoundEntry`` with ``Slot`` in place of each tensor.
    """

    round: int
    global_model: Slot
    aggregate: Slot | None
    updates: Mapping[int, Slot]
    clients: Sequence[ClientRecord]
    scalars: Mapping[str, Scalar]
    shard_models: Mapping[int, Slot] = field(default_factory=dict)


class SpooledRounds(Sequence[RoundEntry]):
    """``RoundEntry`` rounds read back from a ``TensorSpool`` one at a time (module docstring)."""

    def __init__(self, spool: TensorSpool, rounds: Sequence[SpooledRound]) -> None:
        self.spool = spool
        self.heads = tuple(rounds)

    def __len__(self) -> int:
        return len(self.heads)

    @overload
    def __getitem__(self, index: int) -> RoundEntry: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[RoundEntry]: ...

    def __getitem__(self, index: int | slice) -> RoundEntry | Sequence[RoundEntry]:
        if isinstance(index, slice):
            return tuple(self._load(head) for head in self.heads[index])
        return self._load(self.heads[index])

    def _load(self, head: SpooledRound) -> RoundEntry:
        get = self.spool.get
        return RoundEntry(
            round=head.round,
            global_model=get(head.global_model),
            aggregate=None if head.aggregate is None else get(head.aggregate),
            updates={cid: get(slot) for cid, slot in head.updates.items()},
            clients=head.clients,
            scalars=head.scalars,
            shard_models={s: get(slot) for s, slot in head.shard_models.items()},
        )
