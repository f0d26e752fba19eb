"""Applied unlearning results in the store (history/store/events.py): one transaction, the
original rounds' payloads gone with a deletion record, the reconstruction attack defeated."""

import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedunlearn.errors import ConfigError, HistoryError
from fedunlearn.fl.aggregators import fedavg
from fedunlearn.history import ClientRecord, HistoryStore, RoundEntry
from fedunlearn.history.result_file import read_result_file, write_result_file
from fedunlearn.history.store.reconstruction import rebuild_update, reconstructible_updates
from fedunlearn.history.trajectory import Trajectory

DIM = 10_000  # 40 kB payloads: overflow pages, so the page scan can look for them
SIZES = {0: 120, 1: 95, 2: 133, 3: 101}


def _round(r, model, ids, gen, forget=()):
    ids = [c for c in ids if c not in forget]
    ups = {c: 0.01 * torch.randn(DIM, generator=gen) for c in ids}
    agg = fedavg(torch.stack([ups[c] for c in ids]), torch.tensor([float(SIZES[c]) for c in ids]))
    model = model + agg
    clients = [ClientRecord(c, "accepted", num_samples=SIZES[c]) for c in ids]
    return RoundEntry(r, global_model=model, aggregate=agg, updates=ups, clients=clients), model


def fedavg_store(path: Path, rounds: int = 4) -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    m0 = torch.randn(DIM, generator=gen)
    meta = {"config": {"training": {"aggregator": {"name": "fedavg"}}}}
    with HistoryStore.create(path, meta) as s:
        s.write_round(RoundEntry(0, global_model=m0))
        model = m0
        for r in range(1, rounds + 1):
            entry, model = _round(r, model, sorted(SIZES), gen)
            s.write_round(entry)
    return m0


def trajectory_without(m0: torch.Tensor, forget: set[int], rounds: int = 3) -> Trajectory:
    gen = torch.Generator().manual_seed(11)
    entries, model = [], m0
    for r in range(1, rounds + 1):
        entry, model = _round(r, model, sorted(SIZES), gen, forget)
        entries.append(entry)
    return Trajectory(tuple(entries), frozenset(forget))


def apply(store, trajectory=None, model=None, forget=(1,)):
    model = trajectory.final_model if trajectory is not None else model
    return store.apply(
        forget=forget,
        new=forget,
        method="retrain",
        request_kind="forget",
        model=model,
        model_sha256="x",
        trajectory=None if trajectory is None else trajectory.rounds,
    )


def test_apply_replaces_the_rounds_and_the_attack_no_longer_rebuilds_a_deleted_update(tmp_path):
    m0 = fedavg_store(tmp_path)
    with HistoryStore.open(tmp_path) as store:  # before: the aggregates give client 1's update
        original = store.read_update(2, 1)
        rebuilt = rebuild_update(store, 2, 1)
    assert float((rebuilt - original).norm() / original.norm()) < 1e-6
    traj = trajectory_without(m0, {1})

    with HistoryStore.open(tmp_path, writable=True) as store:
        event = apply(store, traj)
        again = store.forget([1])  # forget after apply: nothing left to drop

    assert (event.generation, event.kind, event.rounds_before, event.rounds_after) == (
        1,
        "trajectory",
        4,
        3,
    )
    assert event.dropped_payloads == 4 * (1 + 1 + 4)  # per round: global, aggregate, 4 updates
    assert again.size_bytes == 0
    assert again.payloads == ()
    with HistoryStore.open(tmp_path) as store:
        assert store.rounds() == [0, 1, 2, 3]
        assert torch.equal(store.read_model(0), m0)
        assert torch.equal(store.read_model(3), traj.final_model)
        assert all(1 not in {c.client_id for c in store.client_records(r)} for r in (1, 2, 3))
        assert store.forgotten_clients() == {1}
        assert store.clean_from_round() == 0
        assert store.meta["rounds_target"] == 3
        assert reconstructible_updates(store, [1]) == []
        with pytest.raises(HistoryError):
            rebuild_update(store, 2, 1)  # client 1 took no part in the stored round 2
        records = store.deletion_records([1])
        assert len(records[0].payloads) == 4  # its four original updates, with SHA-256
        check = store.check_deletions([1])
        assert check.ok
        assert check.payloads_checked == 4
        assert check.fingerprints_found == 0
        store.verify()


def test_apply_without_a_trajectory_appends_the_model_and_marks_earlier_rounds(tmp_path):
    fedavg_store(tmp_path)
    model = torch.zeros(DIM)
    with HistoryStore.open(tmp_path, writable=True) as store:
        event = apply(store, model=model, forget=(0, 2))

    with HistoryStore.open(tmp_path) as store:
        assert event.kind == "model"
        assert event.rounds_after == 5
        assert torch.equal(store.read_model(5), model)
        assert store.client_records(5) == []
        assert store.clean_from_round() == 5
        assert store.meta["clean_from_round"] == 5
        assert store.forgotten_clients() == {0, 2}
        assert store.has_update(1, 0)  # not deleted by apply: forget() does that
        assert store.round_scalars(5)["applied_event"] == 1


def test_apply_refuses_a_forgotten_client_in_the_trajectory_and_a_stale_round(tmp_path):
    m0 = fedavg_store(tmp_path)
    traj = trajectory_without(m0, set())
    with HistoryStore.open(tmp_path, writable=True) as store:
        with pytest.raises(ConfigError, match="includes forgotten client"):
            apply(store, traj, forget=(1,))
        with pytest.raises(HistoryError, match="computed on round 3"):
            store.apply(
                forget=[1], new=[1], method="m", request_kind="forget", model=m0,
                model_sha256="x", expected_last_round=3,
            )  # fmt: skip
        assert store.events() == []
        assert store.last_round() == 4


def test_an_old_store_without_the_events_table_reads_and_gets_it_when_opened_writable(tmp_path):
    fedavg_store(tmp_path, rounds=1)
    con = sqlite3.connect(tmp_path / "history.sqlite", isolation_level=None)
    con.execute("DROP TABLE events")
    con.close()
    with HistoryStore.open(tmp_path) as store:
        assert store.events() == []
        assert store.generation() == 0
    with HistoryStore.open(tmp_path, writable=True) as store:
        apply(store, model=torch.zeros(DIM))
        assert store.generation() == 1


def test_the_apply_file_round_trips_the_model_and_the_trajectory(tmp_path):
    m0 = torch.randn(DIM)
    traj = trajectory_without(m0, {1}, rounds=2)
    write_result_file(tmp_path / "r.apply.safetensors", traj.final_model, traj)
    back = read_result_file(tmp_path / "r.apply.safetensors")
    assert torch.equal(back.params, traj.final_model)
    assert back.trajectory.forgotten == {1}
    for a, b in zip(back.trajectory.rounds, traj.rounds, strict=True):
        assert torch.equal(a.global_model, b.global_model)
        assert a.clients == b.clients
        assert set(a.updates) == set(b.updates)
        assert all(torch.equal(a.updates[c], b.updates[c]) for c in a.updates)


_KILLED_APPLY = """
import os, signal, sys, torch
sys.path.insert(0, sys.argv[2])
from test_events import apply, trajectory_without
from fedunlearn.history import HistoryStore
from fedunlearn.history.store.events import Generations
inserted = Generations._insert_round
def insert_then_die(self, entry, now):
    inserted(self, entry, now)
    if entry.round == 2:  # inside the apply's transaction, rounds 1..T already deleted
        os.kill(os.getpid(), signal.SIGKILL)
Generations._insert_round = insert_then_die
with HistoryStore.open(sys.argv[1], writable=True) as store:
    m0 = store.read_model(0)
    apply(store, trajectory_without(m0, {1}))
"""


@pytest.mark.slow
def test_kill_9_inside_apply_changes_nothing_and_the_rerun_equals_an_uninterrupted_apply(
    tmp_path,
):
    m0 = fedavg_store(tmp_path / "cut")
    fedavg_store(tmp_path / "full")
    with HistoryStore.open(tmp_path / "cut") as store:
        before = {(r, k): store.read_model(r, k) for r, k in store.stored_models()}

    child = subprocess.run(
        [sys.executable, "-c", _KILLED_APPLY, str(tmp_path / "cut"), str(Path(__file__).parent)],
        check=False,
    )

    assert child.returncode == -signal.SIGKILL
    with HistoryStore.open(tmp_path / "cut") as store:
        assert store.events() == []
        assert store.last_round() == 4
        assert all(torch.equal(store.read_model(r, k), t) for (r, k), t in before.items())
        assert store.has_update(3, 1)
    for name in ("cut", "full"):
        with HistoryStore.open(tmp_path / name, writable=True) as store:
            apply(store, trajectory_without(m0, {1}))
    with (
        HistoryStore.open(tmp_path / "cut") as a,
        HistoryStore.open(tmp_path / "full") as b,
    ):
        assert a.rounds() == b.rounds() == [0, 1, 2, 3]
        assert a.stored_models() == b.stored_models()
        for r, k in a.stored_models():
            assert torch.equal(a.read_model(r, k), b.read_model(r, k))
        for r in (1, 2, 3):
            assert dict(a.iter_updates(r)).keys() == dict(b.iter_updates(r)).keys()
        assert a.check_deletions([1]).ok
