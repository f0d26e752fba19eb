"""Deletions that hold (issue 33): what the catalogue says was kept against what is there.

The review's cases: a client's updates deleted with raw SQL together with the models
``forget()`` would drop and the client's rows in ``payload_prints`` read as store ``deleted``;
a run of a small model held 0 fingerprint bytes for all its updates; ``forget()`` kept the
per-round norm and ``<Δ_c, G_t>`` that rebuild a deleted update; an apply file in the run
directory kept the updates of a client forgotten later.
"""

import sqlite3
from pathlib import Path

import torch
from tests.support.evidence import flat_evidence

from fedunlearn.eval import build_verification
from fedunlearn.eval.verifier import deletion_evidence
from fedunlearn.fl.aggregators import fedavg
from fedunlearn.history import ClientRecord, HistoryStore, RoundEntry
from fedunlearn.history.policy import DOT_AGGREGATE_KEY
from fedunlearn.history.result_file import write_result_file
from fedunlearn.history.store.reconstruction import models_to_drop
from fedunlearn.history.trajectory import Trajectory
from fedunlearn.runs import forget_clients
from fedunlearn.runs.forget import result_files_holding
from fedunlearn.runs.rundir import restore_config

SMALL = 650  # 2.6 kB float32 updates: each fits in its b-tree page (no overflow page)
SIZES = {0: 120, 1: 95, 2: 133, 3: 101}


def small_run(run: Path, dim: int = SMALL, rounds: int = 4) -> Path:
    """A run directory whose store keeps every accepted update (``history.policy: all``)."""
    gen = torch.Generator().manual_seed(5)
    model = torch.randn(dim, generator=gen)
    meta = {"history_policy": "all", "config": {"training": {"aggregator": {"name": "fedavg"}}}}
    with HistoryStore.create(run / "history", meta) as s:
        s.write_round(RoundEntry(0, global_model=model))
        for r in range(1, rounds + 1):
            ups = {c: 0.01 * torch.randn(dim, generator=gen) for c in SIZES}
            agg = fedavg(
                torch.stack(list(ups.values())),
                torch.tensor(list(SIZES.values()), dtype=torch.float32),
            )
            model = model + agg
            clients = [
                ClientRecord(c, "accepted", num_samples=n, norm=float(ups[c].norm()),
                             scalars={DOT_AGGREGATE_KEY: float(ups[c].double() @ agg.double())})
                for c, n in SIZES.items()
            ]  # fmt: skip
            s.write_round(
                RoundEntry(r, global_model=model, aggregate=agg, updates=ups, clients=clients)
            )
    restore_config(run)  # config.yaml, as a trained run has it (forget checks it)
    return run


def store_check(run: Path, client: int):
    with HistoryStore.open(run / "history") as store:
        evidence = deletion_evidence(store, [client])
    receipt = build_verification(flat_evidence({}, original={}, deletion=evidence))
    return evidence, receipt


def test_every_payload_of_a_small_model_has_fingerprints(tmp_path):
    small_run(tmp_path)
    con = sqlite3.connect(tmp_path / "history" / "history.sqlite")
    rows = con.execute("SELECT kind, length(fingerprints) FROM payload_prints").fetchall()
    con.close()
    assert len(rows) == 1 + 4 * (2 + 4)
    assert all(n >= 8 for _, n in rows)  # was 0 bytes for every one of them


def test_a_raw_sql_deletion_of_updates_models_and_ledger_rows_is_damaged(tmp_path):
    run = small_run(tmp_path)
    with HistoryStore.open(run / "history") as store:
        models = models_to_drop(store, {1})
    con = sqlite3.connect(run / "history" / "history.sqlite", isolation_level=None)
    con.execute("PRAGMA secure_delete=OFF")  # a script's default
    con.execute("DELETE FROM payloads WHERE kind='update' AND client_id=1")
    con.executemany(
        "DELETE FROM payloads WHERE round=? AND kind=? AND client_id=-1", [tuple(m) for m in models]
    )
    con.execute("DELETE FROM payload_prints WHERE client_id=1")
    con.close()

    evidence, receipt = store_check(run, 1)

    assert evidence["unrecorded"] == [[r, 1] for r in range(1, 5)]
    assert sorted(map(tuple, evidence["missing_models"])) == sorted(map(tuple, models))
    # the dropped models' ledger rows are still there: their pages are found, not zeroed
    assert evidence["page_scan"]["fragments_found"] > 0
    check = receipt.check("deletion")
    assert (check.verdict, check.codes) == ("fail", ("unrecorded",))
    assert receipt.store == "damaged"  # it read "deleted": "the store never held updates"


def test_a_raw_sql_deletion_with_secure_delete_is_damaged_too(tmp_path):
    run = small_run(tmp_path)
    con = sqlite3.connect(run / "history" / "history.sqlite", isolation_level=None)
    con.execute("PRAGMA secure_delete=ON")
    con.execute("DELETE FROM payloads WHERE kind='update' AND client_id=2")
    con.execute("DELETE FROM payload_prints WHERE client_id=2")
    con.close()
    evidence, receipt = store_check(run, 2)
    assert evidence["page_scan"]["fragments_found"] == 0  # nothing left to find ...
    assert receipt.store == "damaged"  # ... but no deletion record vouches for it


def test_the_page_scan_finds_a_small_updates_cell_left_by_raw_sql(tmp_path):
    run = small_run(tmp_path)
    con = sqlite3.connect(run / "history" / "history.sqlite", isolation_level=None)
    con.execute("PRAGMA secure_delete=OFF")
    con.execute("DELETE FROM payloads WHERE kind='update' AND client_id=3")
    con.close()
    with HistoryStore.open(run / "history") as store:
        check = store.check_deletions([3])
    assert check.unrecorded == tuple((r, 3) for r in range(1, 5))
    assert check.fingerprints_found > 0  # the anchors of the cells left in the leaf pages
    assert check.control_found == check.control_checked > 0


def test_forget_deletes_what_rebuilds_an_update_and_a_store_check_holds(tmp_path):
    run = small_run(tmp_path)
    forget_clients(run, [1])
    with HistoryStore.open(run / "history") as store:
        rows = [r for t in range(1, 5) for r in store.client_records(t) if r.client_id == 1]
        others = [r for t in range(1, 5) for r in store.client_records(t) if r.client_id == 0]
    assert all(r.norm is None and DOT_AGGREGATE_KEY not in r.scalars for r in rows)
    assert all(r.status == "accepted" and r.num_samples == 95 for r in rows)
    assert all(r.norm is not None and DOT_AGGREGATE_KEY in r.scalars for r in others)
    evidence, receipt = store_check(run, 1)
    assert evidence["scalars_kept"] == []
    assert evidence["unrecorded"] == []
    assert receipt.store == "deleted", receipt.check("deletion").reason
    # a store forgotten before this (its norms kept) is damaged until forgotten again
    con = sqlite3.connect(run / "history" / "history.sqlite", isolation_level=None)
    con.execute("UPDATE clients SET norm=1.5 WHERE client_id=1 AND round=2")
    con.close()
    _, receipt = store_check(run, 1)
    assert receipt.check("deletion").codes == ("scalars_kept",)
    forget_clients(run, [1])
    assert store_check(run, 1)[1].store == "deleted"


def test_an_apply_file_in_the_run_directory_is_deleted_with_the_client(tmp_path):
    run = small_run(tmp_path)
    with HistoryStore.open(run / "history") as store:
        rounds = [
            RoundEntry(t, global_model=store.read_model(t),
                       aggregate=store.read_model(t, "aggregate"),
                       updates={c: store.read_update(t, c) for c in (0, 2, 3)},
                       clients=[r for r in store.client_records(t) if r.client_id != 1])
            for t in range(1, 5)
        ]  # fmt: skip
        final = store.read_model(4)
    leftover = run / "r1.apply.safetensors"  # `unlearn --out run/r1.json`, never applied
    write_result_file(leftover, final, Trajectory(tuple(rounds), frozenset({1})))
    assert [f["path"] for f in result_files_holding(run, [2])] == [str(leftover)]
    evidence, receipt = store_check(run, 2)  # client 2's updates are stored: held, not damaged
    assert evidence["result_files"][0]["updates"] == [[t, 2] for t in range(1, 5)]

    forget_clients(run, [2])

    assert not leftover.exists()  # it kept client 2's updates bit for bit
    evidence, receipt = store_check(run, 2)
    assert evidence["result_files"] == []
    assert receipt.store == "deleted"


def test_a_leftover_result_file_makes_the_store_damaged(tmp_path):
    run = small_run(tmp_path)
    with HistoryStore.open(run / "history") as store:
        mine = [r for r in store.client_records(1) if r.client_id == 2]
        entry = RoundEntry(
            1, global_model=store.read_model(1), updates={2: store.read_update(1, 2)}, clients=mine
        )
    forget_clients(run, [2])
    kept = run / "old.apply.safetensors"  # written before the forget, by hand or a script
    write_result_file(kept, entry.global_model, Trajectory((entry,), frozenset()))
    evidence, receipt = store_check(run, 2)
    check = receipt.check("deletion")
    assert (check.verdict, check.codes) == ("fail", ("result_files",))
    assert receipt.store == "damaged"


def test_zeroed_space_with_a_stray_byte_matches_no_anchor_of_a_sparse_update():
    """A deleted update with runs of zeros (a digit pixel that is always 0) once matched a
    zeroed leaf page holding one stray byte: an anchor needs a varied window."""
    from fedunlearn.history.store.deletion import anchor_prints, page_anchor_prints

    sparse = torch.randn(650)
    sparse[::3] = 0.0
    sparse[100:140] = 0.0
    data = sparse.numpy().tobytes()
    prints = anchor_prints((None, 1, "update", 3, "float32", "[650]", len(data), 1, data), 16384)
    wanted = {prints[i : i + 8] for i in range(0, len(prints), 8)}
    assert wanted  # a sparse update still has fingerprints
    zeroed = bytearray(16384)
    zeroed[13403 + 31] = 0xC8  # where a cell was zeroed, one byte of the next one
    assert not page_anchor_prints(bytes(zeroed)) & wanted
    placed = bytearray(16384)
    placed[3000 : 3000 + len(data)] = data  # the same update left in a page: found
    assert page_anchor_prints(bytes(placed)) & wanted == wanted
