"""A deletion that holds: the page scan catches deletions outside forget(), and what forget()
keeps cannot rebuild a deleted update (history/store/reconstruction.py)."""

import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedunlearn.errors import ForgottenDataError, HistoryError, UnsupportedHistoryError
from fedunlearn.eval.verifier import deletion_evidence
from fedunlearn.fl.aggregators import fedavg
from fedunlearn.history import ClientRecord, HistoryStore, RoundEntry
from fedunlearn.history.store import DroppedModelError
from fedunlearn.history.store import erasure as erasure_module
from fedunlearn.history.store.reconstruction import rebuild_update, reconstructible_updates

DIM = 10_000  # 40 kB float32 payloads: two or more overflow pages each
SIZES = {0: 120, 1: 95, 2: 133, 3: 101}


def fedavg_store(path: Path, rounds: int = 4, late: dict[int, set[int]] | None = None) -> Path:
    """Write a run whose models, aggregates and updates are tied as the engine ties them."""
    gen = torch.Generator().manual_seed(3)
    model = torch.randn(DIM, generator=gen)
    with HistoryStore.create(
        path, {"config": {"training": {"aggregator": {"name": "fedavg"}}}}
    ) as s:
        s.write_round(RoundEntry(0, global_model=model))
        for r in range(1, rounds + 1):
            ids = sorted(set(SIZES) | (late or {}).get(r, set()))
            ups = {c: 0.01 * torch.randn(DIM, generator=gen) for c in ids}
            n = {c: SIZES.get(c, 77) for c in ids}
            agg = fedavg(
                torch.stack([ups[c] for c in ids]), torch.tensor([float(n[c]) for c in ids])
            )
            model = model + agg
            s.write_round(
                RoundEntry(
                    r,
                    global_model=model,
                    aggregate=agg,
                    updates=ups,
                    clients=[ClientRecord(c, "accepted", num_samples=n[c]) for c in ids],
                )
            )
    return path


def raw_delete(path: Path, client_id: int, *, secure: bool) -> None:
    """Delete a client's updates the way a script would: plain SQL, no forget()."""
    con = sqlite3.connect(path / "history.sqlite", isolation_level=None)
    con.execute(f"PRAGMA secure_delete={'ON' if secure else 'OFF'}")
    con.execute("DELETE FROM payloads WHERE kind='update' AND client_id=?", (client_id,))
    con.close()


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


# ----- the page scan runs whether or not forget() recorded a deletion ----------------------------


def test_raw_sql_deletion_leaves_fragments_that_the_page_scan_finds(tmp_path):
    fedavg_store(tmp_path)
    raw_delete(tmp_path, 1, secure=False)

    with HistoryStore.open(tmp_path) as store:
        evidence = deletion_evidence(store, [1])
        check = store.check_deletions([1])
    scan = evidence["page_scan"]

    assert scan["ran"] is True
    assert scan["fragments_found"] > 0  # the pages were freed, not zeroed
    assert scan["unrecorded"] == [[r, 1] for r in range(1, 5)]
    assert evidence["records"] == []
    assert evidence["bytes_held"] == {1: 0}
    assert evidence["scan"]["ok"] is False  # the receipt's store verdict is not "deleted"
    assert not check.ok
    assert any("deleted outside forget" in p for p in check.problems)


def test_raw_sql_deletion_with_secure_delete_leaves_no_fragment_but_is_listed(tmp_path):
    fedavg_store(tmp_path)
    raw_delete(tmp_path, 1, secure=True)

    with HistoryStore.open(tmp_path) as store:
        scan = deletion_evidence(store, [1])["page_scan"]

    assert scan["fragments_found"] == 0
    assert scan["unrecorded"] == [[r, 1] for r in range(1, 5)]
    assert scan["inconclusive_reason"] is None


def test_store_without_the_fingerprint_ledger_says_the_scan_is_inconclusive(tmp_path):
    fedavg_store(tmp_path)
    con = sqlite3.connect(tmp_path / "history.sqlite", isolation_level=None)
    con.executescript(  # a store written before the ledger and the "kept" marker existed
        "DROP TABLE payload_prints; DROP TABLE forget_models; "
        "DELETE FROM info WHERE key IN ('prints_from_round', 'stored_from_round'); "
        "ALTER TABLE clients DROP COLUMN stored_at;"
    )
    con.close()
    raw_delete(tmp_path, 2, secure=False)

    with HistoryStore.open(tmp_path) as store:  # read-only: nothing upgrades it
        scan = deletion_evidence(store, [2])["page_scan"]

    # no record of what was kept (no ledger, no marker, no policy that keeps every update)
    assert scan["ran"] is True
    assert scan["unrecorded"] == []
    assert "before the fingerprint ledger existed" in scan["inconclusive_reason"]
    assert "round 1 client 2" in scan["inconclusive_reason"]


def test_truncated_rounds_leave_no_unrecorded_deletion(tmp_path):
    fedavg_store(tmp_path)
    with HistoryStore.open(tmp_path, writable=True) as store:
        store.truncate_after(2)
        check = store.check_deletions()

    assert check.unrecorded == ()
    assert check.ok
    assert check.inconclusive_reason is None


# ----- the reconstruction attack -----------------------------------------------------------------


@pytest.mark.parametrize("keep", ["aggregates", "global models only"])
def test_attack_rebuilds_every_update_when_forget_keeps_the_models(tmp_path, monkeypatch, keep):
    """main's forget(): updates deleted, aggregates and global models kept."""
    fedavg_store(tmp_path)
    monkeypatch.setattr(erasure_module, "models_to_drop", lambda store, ids: [])
    with HistoryStore.open(tmp_path, writable=True) as store:
        original = {r: store.read_update(r, 1) for r in range(1, 5)}
        store.forget([1])
    if keep == "global models only":
        raw = sqlite3.connect(tmp_path / "history.sqlite", isolation_level=None)
        raw.execute("PRAGMA secure_delete=ON")
        raw.execute("DELETE FROM payloads WHERE kind='aggregate'")
        raw.close()

    with HistoryStore.open(tmp_path) as store:
        listed = reconstructible_updates(store, [1])
        errors = [relative_error(rebuild_update(store, r, 1), original[r]) for r in range(1, 5)]
        evidence = deletion_evidence(store, [1])

    assert listed == [[r, 1] for r in range(1, 5)]
    assert evidence["reconstructible"] == listed
    # from M_t − M_{t−1} the float32 rounding of the models (|M| ~ 100 |Δ| here) dominates
    assert max(errors) <= (6.5e-7 if keep == "aggregates" else 1e-4)


def test_forget_drops_what_would_rebuild_the_deleted_updates(tmp_path):
    fedavg_store(tmp_path)
    with HistoryStore.open(tmp_path, writable=True) as store:
        original = {r: store.read_update(r, 1) for r in range(1, 5)}
        first, last = store.read_model(0), store.read_model(4)
        record = store.forget([1])

    with HistoryStore.open(tmp_path) as store:
        listed = reconstructible_updates(store, [1])
        evidence = deletion_evidence(store, [1])
        for r in range(1, 5):
            with pytest.raises(HistoryError):
                rebuild_update(store, r, 1)
        with pytest.raises(DroppedModelError, match="dropped by forget"):
            store.read_model(2)
        kept = store.read_model(0), store.read_model(4)
        check = store.check_deletions([1])
        # the best the attacker has left: the sum over the rounds (the influence on M_4)
        total = (store.read_model(4) - store.read_model(0)).double() * sum(SIZES.values())
        for r in range(1, 5):
            for c in (0, 2, 3):
                total -= SIZES[c] * store.read_update(r, c).double()
        guess = (total / SIZES[1] / 4).float()  # spread evenly over the four rounds

    assert listed == []
    assert evidence["reconstructible"] == []
    assert {(m.round, m.kind) for m in record.models} == {(r, "aggregate") for r in range(1, 5)} | {
        (r, "global") for r in range(1, 4)
    }
    assert record.model_bytes == 7 * DIM * 4
    assert all(m.num_fingerprints >= 2 for m in record.models)
    assert torch.equal(kept[0], first)
    assert torch.equal(kept[1], last)
    assert check.ok
    assert check.fingerprints_checked >= 2 * (4 + 7)
    assert min(relative_error(guess, original[r]) for r in range(1, 5)) > 0.5
    with pytest.raises(UnsupportedHistoryError):  # a method reading them refuses, see base.py
        raise DroppedModelError("a DroppedModelError is an UnsupportedHistoryError")
    assert issubclass(DroppedModelError, ForgottenDataError)


def test_a_client_aggregated_in_a_single_round_stays_rebuildable_and_is_listed(tmp_path):
    """The limit: M_T − M_0 minus the other rounds' aggregates is that one update."""
    fedavg_store(tmp_path, late={2: {5}})
    with HistoryStore.open(tmp_path, writable=True) as store:
        original = store.read_update(2, 5)
        record = store.forget([5])

    with HistoryStore.open(tmp_path) as store:
        listed = reconstructible_updates(store, [5])
        rebuilt = rebuild_update(store, 2, 5)

    assert {(m.round, m.kind) for m in record.models} == {(2, "aggregate")}
    assert listed == [[2, 5]]
    assert relative_error(rebuilt, original) < 1e-4


def test_forget_is_cumulative_and_records_the_dropped_models_in_the_metadata(tmp_path):
    fedavg_store(tmp_path, rounds=5, late={2: {6}, 4: {6}})
    with HistoryStore.open(tmp_path, writable=True) as store:
        first = store.forget([6])
        again = store.forget([6])
        meta = store.meta

    assert {(m.round, m.kind) for m in first.models} == {
        (2, "aggregate"),
        (4, "aggregate"),
        (2, "global"),
        (3, "global"),
    }
    assert again.models == ()
    assert again.size_bytes == 0
    assert meta["dropped_models"] == [
        [2, "aggregate"],
        [2, "global"],
        [3, "global"],
        [4, "aggregate"],
    ]


_KILLED_FORGET = """
import os, signal, sys
from fedunlearn.history import HistoryStore
from fedunlearn.history.store.erasure import Erasure
Erasure._incremental_vacuum = lambda self: os.kill(os.getpid(), signal.SIGKILL)
with HistoryStore.open(sys.argv[1], writable=True) as store:
    store.forget([1])
"""


@pytest.mark.slow
def test_kill_9_inside_forget_changes_nothing_and_a_second_forget_completes(tmp_path):
    fedavg_store(tmp_path)
    with HistoryStore.open(tmp_path) as store:
        before = {(r, k): store.read_model(r, k) for r, k in store.stored_models()}
        updates = {r: store.read_update(r, 1) for r in range(1, 5)}

    child = subprocess.run([sys.executable, "-c", _KILLED_FORGET, str(tmp_path)], check=False)

    assert child.returncode == -signal.SIGKILL  # killed inside the forget transaction
    with HistoryStore.open(tmp_path) as store:  # read-only, over the crashed WAL
        assert {(r, k) for r, k in store.stored_models()} == set(before)
        assert all(torch.equal(store.read_model(r, k), t) for (r, k), t in before.items())
        assert all(torch.equal(store.read_update(r, 1), u) for r, u in updates.items())
        assert store.deletion_records() == []
        assert "dropped_models" not in store.meta
    with HistoryStore.open(tmp_path, writable=True) as store:
        record = store.forget([1])
    with HistoryStore.open(tmp_path) as store:
        assert len(record.models) == 7
        assert reconstructible_updates(store, [1]) == []
        assert store.check_deletions([1]).ok


def test_a_dropped_model_equal_to_a_kept_one_is_not_reported_as_left_behind(tmp_path):
    """A round with no accepted update leaves M_t == M_{t+1}: the kept copy is not a leftover."""
    fedavg_store(tmp_path, rounds=3)
    with HistoryStore.open(tmp_path, writable=True) as store:
        last = store.read_model(3)
        store.write_round(RoundEntry(4, global_model=last, clients=[ClientRecord(1, "missing")]))
        store.write_round(
            RoundEntry(
                5,
                global_model=last.clone(),
                updates={1: torch.randn(DIM)},
                aggregate=torch.randn(DIM),
                clients=[ClientRecord(1, "accepted", num_samples=9)],
            )
        )
        record = store.forget([1])
        check = store.check_deletions([1])

    assert (3, "global") in {(m.round, m.kind) for m in record.models}  # == the kept M_4 bytes
    assert check.ok
    assert check.fingerprints_found == 0


def test_an_old_store_gets_the_ledger_on_its_first_writable_open_from_the_next_round(tmp_path):
    fedavg_store(tmp_path, rounds=2)
    con = sqlite3.connect(tmp_path / "history.sqlite", isolation_level=None)
    con.executescript(  # a store written before the ledger and the clients' "kept" marker
        "DROP TABLE payload_prints; DROP TABLE forget_models; "
        "DELETE FROM info WHERE key IN ('prints_from_round', 'stored_from_round'); "
        "ALTER TABLE clients DROP COLUMN stored_at;"
    )
    con.close()
    with HistoryStore.open(tmp_path, writable=True) as store:  # upgrades the file
        store.write_round(
            RoundEntry(
                3,
                global_model=torch.randn(DIM),
                updates={2: torch.randn(DIM)},
                clients=[ClientRecord(2, "accepted", num_samples=5)],
            )
        )
    raw_delete(tmp_path, 2, secure=False)

    with HistoryStore.open(tmp_path) as store:
        check = store.check_deletions([2])

    # the ledger covers round 3 on; the upgrade marked the updates stored then (rounds 1, 2)
    # as kept, so the catalogue shows those gone unrecorded too
    assert check.unrecorded == ((1, 2), (2, 2), (3, 2))
    assert check.fingerprints_found > 0
    assert not check.ok
    assert check.inconclusive_reason is None


@pytest.mark.slow
def test_weights_no_round_changes_are_not_reported_as_left_behind(tmp_path):
    """A user review: forget on a deletion-ready digits MLP exited 1 on every run.

    The inputs of digits' always-blank pixels keep their initial weights, so every global
    model holds the same bytes there; a dropped model's anchor matched a kept model's later
    anchor, which the ledger (the first anchors of each payload) did not hold.
    """
    from fedunlearn.config import parse_config
    from fedunlearn.runs import train_run

    config = {
        "seed": 0,
        "data": {"dataset": "digits", "num_clients": 50, "partition": "iid"},
        "model": {"name": "mlp", "hidden": [32]},
        "training": {
            "rounds": 20,
            "participation": 0.1,
            "sampling": "tv_stable",
            "local_steps": 5,
            "batch_size": 10,
            "lr": 0.1,
        },
        "history": {"policy": "none"},
    }
    train_run(parse_config(config), tmp_path / "run")
    with HistoryStore.open(tmp_path / "run" / "history", writable=True) as store:
        record = store.forget([0])
        check = store.check_deletions([0])
    assert len(record.models) == 17  # 14 global models and 3 aggregates dropped
    assert check.problems == ()
    assert check.fingerprints_found == 0
    assert check.ok


def test_a_deleted_update_whose_every_print_a_kept_one_holds_makes_the_scan_inconclusive(
    tmp_path,
):
    """A review: shared prints were dropped from the hits, and such an update read as gone.

    Client 1's update is [A | B], client 2's [C | A]: every anchor the ledger records for
    client 1 lies in A, which client 2's kept update holds too, so the scan cannot tell a
    leftover of client 1's cell (B is still in the file: no secure_delete) from client 2's.
    """
    gen = torch.Generator().manual_seed(0)
    shared = 0.01 * torch.randn(300, generator=gen)
    model = torch.randn(600, generator=gen)  # 2,400-byte payloads: they fit a leaf page
    with HistoryStore.create(
        tmp_path, {"config": {"training": {"aggregator": {"name": "fedavg"}}}}
    ) as s:
        s.write_round(RoundEntry(0, global_model=model))
        for r in (1, 2):
            ups = {
                1: torch.cat([shared, 0.01 * torch.randn(300, generator=gen)]),
                2: torch.cat([0.01 * torch.randn(300, generator=gen), shared]),
            }
            agg = fedavg(torch.stack([ups[1], ups[2]]), torch.tensor([1.0, 1.0]))
            model = model + agg
            records = [ClientRecord(c, "accepted", num_samples=1) for c in ups]
            s.write_round(
                RoundEntry(r, global_model=model, aggregate=agg, updates=ups, clients=records)
            )
    raw_delete(tmp_path, 1, secure=False)

    with HistoryStore.open(tmp_path) as store:
        check = store.check_deletions([1])

    assert check.fingerprints_found == 0  # the kept copies are not counted as leftovers
    assert check.inconclusive_reason is not None
    assert "(round 1 client 1 (deleted outside forget))" in check.inconclusive_reason
    assert "cannot tell a leftover of them from the kept copies" in check.inconclusive_reason
