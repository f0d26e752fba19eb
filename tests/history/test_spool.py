"""Trajectories on disk (history.spool) and the apply file written one tensor at a time."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from fedunlearn.errors import ConfigError
from fedunlearn.history import ClientRecord, RoundEntry
from fedunlearn.history.result_file import file_sha256, read_result_file, write_result_file
from fedunlearn.history.spool import SpooledRound, SpooledRounds, TensorSpool
from fedunlearn.history.trajectory import Trajectory
from fedunlearn.models.export import write_safetensors
from fedunlearn.unlearn.trajectory_log import TrajectoryLog

DIM = 1_000


def _entries(rounds: int = 3, shards: bool = False) -> list[RoundEntry]:
    gen = torch.Generator().manual_seed(5)
    model, out = torch.randn(DIM, generator=gen), []
    for r in range(1, rounds + 1):
        ups = {c: torch.randn(DIM, generator=gen) for c in (2, 10, 3)}
        agg = sum(ups.values()) / 3
        model = model + agg
        out.append(
            RoundEntry(
                r,
                global_model=model,
                aggregate=agg,
                updates=ups,
                clients=[ClientRecord(c, "accepted", num_samples=10 + c) for c in ups],
                scalars={"loss": 0.5 / r},
                shard_models={0: model * 2, 1: model * 3} if shards else {},
            )
        )
    # a round that trained nobody keeps the previous model: the same tensor twice
    out.append(RoundEntry(rounds + 1, global_model=model, aggregate=torch.zeros(DIM)))
    return out


def _spooled(entries: list[RoundEntry]) -> SpooledRounds:
    spool = TensorSpool()
    heads = [
        SpooledRound(
            e.round,
            spool.put(e.global_model),
            None if e.aggregate is None else spool.put(e.aggregate),
            {c: spool.put(t) for c, t in e.updates.items()},
            e.clients,
            e.scalars,
            {s: spool.put(t) for s, t in e.shard_models.items()},
        )
        for e in entries
    ]
    return SpooledRounds(spool, heads)


def _safetensors_reference(path, params, trajectory) -> str:
    """The apply file as safetensors' own writer lays it out (all tensors in memory)."""
    from fedunlearn.history import result_file as rf

    tensors = {"params": params.clone()}
    for entry in trajectory.rounds:
        tensors |= {k: v.clone() for k, v in rf._round_tensors(entry)}
    meta = {
        "format": rf._FORMAT,
        "trajectory": rf.json.dumps(
            {
                "forgotten": sorted(trajectory.forgotten),
                "rounds": [rf._round_meta(e) for e in trajectory.rounds],
                "kept": trajectory.kept,
            }
        ),
    }
    write_safetensors(path, lambda tmp: save_file(tensors, tmp, metadata=meta))
    return file_sha256(path)


def _bytes(tensor: torch.Tensor) -> list[int]:
    return tensor.contiguous().reshape(-1).view(torch.uint8).tolist()


def test_a_spool_gives_back_every_tensor_bit_for_bit():
    spool = TensorSpool()
    tensors = [
        torch.randn(7, 3),
        torch.tensor(2.5, dtype=torch.float64),
        torch.empty(0),
        torch.arange(5, dtype=torch.int64),
        torch.randn(4, 6).t(),  # not contiguous
        torch.full((3,), float("nan")),
    ]
    slots = [spool.put(t) for t in tensors]
    for tensor, slot in zip(tensors, slots, strict=True):
        back = spool.get(slot)
        assert back.dtype == tensor.dtype
        assert back.shape == tensor.shape
        assert _bytes(back) == _bytes(tensor)
    assert spool.nbytes == sum(s.nbytes for s in slots)
    assert b"".join(spool.chunks(slots[0])) == tensors[0].numpy().tobytes()


@pytest.mark.parametrize("shards", [False, True])
def test_spooled_rounds_read_back_the_rounds(shards):
    entries = _entries(shards=shards)
    rounds = _spooled(entries)
    assert len(rounds) == len(entries)
    for a, b in zip(rounds, entries, strict=True):
        assert torch.equal(a.global_model, b.global_model)
        assert torch.equal(a.aggregate, b.aggregate)
        assert a.updates.keys() == b.updates.keys()
        assert all(torch.equal(a.updates[c], b.updates[c]) for c in b.updates)
        assert all(torch.equal(a.shard_models[s], b.shard_models[s]) for s in b.shard_models)
        assert a.clients == b.clients
    assert [e.round for e in rounds[1:3]] == [2, 3]


def test_a_spooled_trajectory_is_checked_as_a_tuple_one_is():
    entries = _entries()
    traj = Trajectory(_spooled(entries), frozenset({7}))
    assert traj.length == len(entries)
    assert traj.num_updates() == 9
    assert Trajectory(tuple(entries), frozenset()).num_updates() == 9
    assert torch.equal(traj.final_model, entries[-1].global_model)
    with pytest.raises(ConfigError, match="forgotten client"):
        Trajectory(_spooled(entries), frozenset({10}))
    with pytest.raises(ConfigError, match="numbered"):
        Trajectory(_spooled(entries[1:]), frozenset())


@pytest.mark.parametrize("spooled", [False, True])
@pytest.mark.parametrize("shards", [False, True])
def test_the_streamed_apply_file_has_safetensors_own_bytes(tmp_path, spooled, shards):
    entries = _entries(shards=shards)
    rounds = _spooled(entries) if spooled else tuple(entries)
    traj = Trajectory(rounds, frozenset({7}), kept=0)
    params = entries[-1].global_model  # shares memory with the last rounds' model
    digest = write_result_file(tmp_path / "a.safetensors", params, traj)
    assert digest == _safetensors_reference(tmp_path / "b.safetensors", params, traj)
    back = read_result_file(tmp_path / "a.safetensors")
    assert torch.equal(back.params, params)
    assert back.trajectory is not None
    assert len(back.trajectory.rounds) == len(entries)
    assert torch.equal(back.trajectory.rounds[0].updates[10], entries[0].updates[10])


def test_an_apply_file_without_a_trajectory_keeps_its_bytes(tmp_path):
    from fedunlearn.history import result_file as rf

    params = torch.randn(DIM)
    digest = write_result_file(tmp_path / "a.safetensors", params, None)
    meta = {"format": rf._FORMAT, "trajectory": "null"}
    tensors = {"params": params.clone()}
    write_safetensors(tmp_path / "b", lambda tmp: save_file(tensors, tmp, metadata=meta))
    assert digest == file_sha256(tmp_path / "b")
    assert read_result_file(tmp_path / "a.safetensors").trajectory is None


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096


def test_a_trajectory_log_does_not_hold_its_rounds_in_memory():
    """40 rounds of 3 x 1 MB: held in memory they added 120 MB; spooled, about nothing."""
    sizes = SimpleNamespace(num_samples=lambda cid: 10)
    log = TrajectoryLog(SimpleNamespace(clients=sizes))  # type: ignore[arg-type]
    d = 250_000
    before = _rss_bytes()
    for r in range(40):
        update = torch.full((d,), float(r))
        log.add(update * 2, update, [(1, update)])
        del update
    grown = _rss_bytes() - before
    traj = log.trajectory(frozenset())
    assert traj is not None
    assert traj.length == 40
    assert grown < 40e6, f"RSS grew by {grown / 1e6:.0f} MB while recording 120 MB"
    assert float(traj.rounds[39].updates[1][0]) == 39.0
