"""Tests of the SQLite history store: round trips, atomicity, crashes, forgetting, corruption."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedunlearn.errors import (
    ConfigError,
    ForgottenDataError,
    HistoryCorruptError,
    HistoryError,
    UnknownClientError,
)
from fedunlearn.fl.records import UpdateStatus
from fedunlearn.history import ClientRecord, HistoryStore, RoundEntry
from fedunlearn.history import store as store_module
from fedunlearn.history.store import WriterLock

DIM = 10_000  # 40 kB float32 payloads: several pages each


def payload(seed: int, dim: int = DIM) -> torch.Tensor:
    return torch.randn(dim, generator=torch.Generator().manual_seed(seed))


def make_round(r: int, clients: tuple[int, ...] = (0, 1, 2), dim: int = DIM) -> RoundEntry:
    return RoundEntry(
        round=r,
        global_model=payload(1000 * r, dim),
        aggregate=payload(1000 * r + 999, dim),
        updates={c: payload(1000 * r + c + 1, dim) for c in clients},
        clients=[
            ClientRecord(c, "accepted", num_samples=10 + c, norm=1.5, loss=0.25) for c in clients
        ],
        scalars={"accuracy": 0.5 + r / 100, "note": f"round {r}"},
    )


def build(path: Path, rounds: int = 3, clients: tuple[int, ...] = (0, 1, 2)) -> HistoryStore:
    store = HistoryStore.create(path, {"seed": 7, "dataset": "digits"})
    store.write_round(RoundEntry(0, global_model=payload(0)))
    for r in range(1, rounds + 1):
        store.write_round(make_round(r, clients))
    return store


def store_files_bytes(path: Path) -> bytes:
    return b"".join(f.read_bytes() for f in sorted(path.iterdir()) if f.is_file())


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(
            a.contiguous().reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)
        )
    )


# ----- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tensor",
    [
        torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-45, 3.4e38]),
        torch.randn(3, 4, dtype=torch.float64),
        torch.randn(17).to(torch.float16),
        torch.randn(2, 5).to(torch.bfloat16),
        torch.randint(-(2**62), 2**62, (9,), dtype=torch.int64),
        torch.randint(-128, 127, (4, 2), dtype=torch.int8),
        torch.randint(0, 255, (33,), dtype=torch.uint8),
        torch.tensor([True, False, True]),
        torch.randn(6, dtype=torch.complex64),
        torch.tensor(3.25),  # 0-d
        torch.empty(0, 3),  # empty
        torch.randn(4, 6).t(),  # non-contiguous
    ],
    ids=lambda t: f"{str(t.dtype).removeprefix('torch.')}-{tuple(t.shape)}",
)
def test_round_trip_is_bit_exact_for_every_dtype_and_shape(tmp_path, tensor):
    with HistoryStore.create(tmp_path, {}) as store:
        store.write_round(RoundEntry(0, global_model=tensor))
        store.write_round(
            RoundEntry(
                1, aggregate=tensor, updates={4: tensor}, clients=[ClientRecord(4, "accepted")]
            )
        )

    with HistoryStore.open(tmp_path) as store:
        got = [store.read_model(0), store.read_model(1, "aggregate"), store.read_update(1, 4)]

    for g in got:
        assert same_bits(tensor, g)


def test_returned_tensors_are_owned_and_writable(tmp_path):
    with build(tmp_path, rounds=1) as store:
        first = store.read_update(1, 0)
        first.add_(1.0)  # would warn or fail on a read-only buffer
        again = store.read_update(1, 0)

    assert torch.equal(again, payload(1001))
    assert torch.equal(first, payload(1001) + 1.0)


def test_meta_client_records_and_scalars_round_trip(tmp_path):
    records = [
        ClientRecord(3, UpdateStatus.ACCEPTED, 50, norm=2.0, loss=0.1, scalars={"epochs": 2}),
        ClientRecord(1, "rejected", 40, norm=float("nan"), reason="NaN in update"),
        ClientRecord(8, "missing", reason="timeout"),
    ]
    updates = {3: payload(1), 1: payload(2)}
    with HistoryStore.create(tmp_path, {"config": {"lr": 0.1}}) as store:
        store.write_round(RoundEntry(0, global_model=payload(0)))
        store.write_round(
            RoundEntry(1, None, None, updates, records, {"acc": 0.9, "n": 3, "x": None})
        )
        store.update_meta({"finished": True})

    with HistoryStore.open(tmp_path) as store:
        got = store.client_records(1)
        assert store.meta == {"config": {"lr": 0.1}, "finished": True}
        assert store.round_scalars(1) == {"acc": 0.9, "n": 3, "x": None}
        assert store.round_scalars(0) == {}

    assert [r.client_id for r in got] == [1, 3, 8]
    assert [(r.status, r.stored) for r in got] == [
        ("rejected", True),
        ("accepted", True),
        ("missing", False),
    ]
    assert got[1] == ClientRecord(3, "accepted", 50, 2.0, 0.1, None, {"epochs": 2}, stored=True)
    assert got[0].reason == "NaN in update"
    assert got[0].norm != got[0].norm  # NaN kept
    assert got[2].reason == "timeout"


def test_read_model_kinds_and_missing_payloads(tmp_path):
    with build(tmp_path, rounds=2) as store:
        store.write_round(RoundEntry(3, global_model=None, aggregate=payload(5)))

        assert torch.equal(store.read_model(0), payload(0))
        assert torch.equal(store.read_model(2, "global"), payload(2000))
        assert torch.equal(store.read_model(2, "aggregate"), payload(2999))
        with pytest.raises(HistoryError, match="round 3 has no global model"):
            store.read_model(3)
        with pytest.raises(HistoryError, match="round 0 has no aggregate"):
            store.read_model(0, "aggregate")
        with pytest.raises(HistoryError, match=r"round 9 is not stored \(stored rounds: 0\.\.3\)"):
            store.read_model(9)
        with pytest.raises(ConfigError, match="kind must be one of global, aggregate"):
            store.read_model(1, "delta")


def test_read_update_never_stored_is_a_history_error_not_forgotten(tmp_path):
    with HistoryStore.create(tmp_path, {}) as store:
        store.write_round(RoundEntry(0, global_model=payload(0)))
        store.write_round(
            RoundEntry(
                1,
                updates={0: payload(1)},
                clients=[ClientRecord(0, "accepted"), ClientRecord(1, "missing")],
            )
        )

        with pytest.raises(HistoryError, match="client 1: the client is missing") as missing:
            store.read_update(1, 1)
        with pytest.raises(HistoryError, match="client 5: the client was not sampled") as unsampled:
            store.read_update(1, 5)
        with pytest.raises(HistoryError, match="round 2 is not stored"):
            store.read_update(2, 0)

    assert type(missing.value) is HistoryError
    assert type(unsampled.value) is HistoryError
    assert store.file.name in str(missing.value)


# ----- writing rules ---------------------------------------------------------------------------


def test_rounds_must_increase_and_committed_rounds_cannot_be_rewritten(tmp_path):
    with build(tmp_path, rounds=2) as store:
        with pytest.raises(
            HistoryError, match="round 2 is committed already.*truncate_after\\(1\\)"
        ):
            store.write_round(make_round(2))
        with pytest.raises(HistoryError, match="round 1 is committed already"):
            store.write_round(make_round(1))
        store.write_round(make_round(5))  # gaps are fine: policies may skip rounds
        with pytest.raises(HistoryError, match="round 4 comes before the last round 5"):
            store.write_round(make_round(4))

        assert store.rounds() == [0, 1, 2, 5]
        assert store.last_round() == 5
        assert torch.equal(store.read_update(2, 1), payload(2002))  # the original survives


def test_empty_store_has_no_rounds(tmp_path):
    with HistoryStore.create(tmp_path, {}) as store:
        assert store.rounds() == []
        assert store.last_round() is None
        assert store.stored_bytes() == 0


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: RoundEntry(1, updates={2: payload(1)}, clients=[]),
            "client 2, which has no ClientRecord",
        ),
        (
            lambda: RoundEntry(1, updates={2: payload(1)}, clients=[ClientRecord(2, "missing")]),
            "status missing",
        ),
        (lambda: RoundEntry(0, global_model=payload(0), updates={0: payload(1)}), "M_0 only"),
        (lambda: RoundEntry(0), "M_0 only"),
        (lambda: RoundEntry(-1), "round must be an int >= 0"),
        (
            lambda: RoundEntry(1, updates={0: [1.0]}, clients=[ClientRecord(0, "accepted")]),
            "must be a torch.Tensor",
        ),
        (
            lambda: RoundEntry(
                1, clients=[ClientRecord(0, "accepted"), ClientRecord(0, "missing")]
            ),
            "more than one",
        ),
        (lambda: RoundEntry(1, scalars={"t": torch.tensor(1.0)}), r"\.item\(\)"),
        (lambda: ClientRecord(0, "acepted"), "accepted, rejected, missing; got 'acepted'"),
        (lambda: ClientRecord(0, "accepted", num_samples=-1), "num_samples must be an int >= 0"),
    ],
)
def test_invalid_entries_are_refused_at_construction(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_write_round_failing_midway_leaves_no_trace(tmp_path, monkeypatch):
    store = build(tmp_path, rounds=2)
    before = (store.rounds(), store.stored_bytes_by_client(), store.stored_bytes_by_kind())
    original = HistoryStore._insert_payload
    calls = []

    def fail_on_fourth(self, *args):
        calls.append(args[:3])
        if len(calls) == 4:  # global, aggregate and client 0 are inserted by now
            raise RuntimeError("disk on fire")
        original(self, *args)

    monkeypatch.setattr(HistoryStore, "_insert_payload", fail_on_fourth)

    with pytest.raises(RuntimeError, match="disk on fire"):
        store.write_round(make_round(3))

    assert len(calls) == 4
    assert (store.rounds(), store.stored_bytes_by_client(), store.stored_bytes_by_kind()) == before
    assert not store.has_update(3, 0)
    with pytest.raises(HistoryError, match="round 3 is not stored"):
        store.client_records(3)
    monkeypatch.setattr(HistoryStore, "_insert_payload", original)
    store.write_round(make_round(3))  # the same round can now be written in full
    store.close()
    with HistoryStore.open(tmp_path) as reopened:
        assert reopened.rounds() == [0, 1, 2, 3]
        assert len(list(reopened.iter_updates(3))) == 3
        reopened.verify()


def test_write_round_refused_by_sqlite_midway_rolls_back(tmp_path):
    store = build(tmp_path, rounds=1)
    before = store.stored_bytes()
    entry = make_round(2, clients=(0, 1))
    big = RoundEntry(
        2, entry.global_model, None, {0: payload(1), 1: payload(2, 20_000)}, entry.clients
    )
    # Lower SQLite's BLOB limit after our size check so that the second update fails inside SQLite.
    real_getlimit = store._db.getlimit
    store._con = _LimitedConnection(store._db, real_getlimit)
    store._db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 50_000)

    with pytest.raises(HistoryError, match="while writing round 2"):
        store.write_round(big)

    assert store.rounds() == [0, 1]
    assert store.stored_bytes() == before
    store.close()


class _LimitedConnection:
    """A connection whose getlimit() reports no limit, to reach SQLite's own check."""

    def __init__(self, con, getlimit):
        self._con = con

    def getlimit(self, category):
        return 2**31

    def __getattr__(self, name):
        return getattr(self._con, name)


def test_payload_over_the_blob_limit_is_refused_before_writing(tmp_path):
    with build(tmp_path, rounds=1) as store:
        store._db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1000)
        with pytest.raises(ConfigError, match="round 2 global model is 40000 bytes"):
            store.write_round(make_round(2))
        assert store.rounds() == [0, 1]


def test_truncate_after_drops_later_rounds_in_one_step(tmp_path):
    with build(tmp_path, rounds=4) as store:
        per_round = sum(t.numel() * 4 for t in [payload(0)] * 5)  # global, aggregate, 3 updates

        store.truncate_after(2)

        assert store.rounds() == [0, 1, 2]
        assert store.stored_bytes() == DIM * 4 + 2 * per_round
        assert not store.has_update(3, 0)
        store.write_round(make_round(3))  # resume from round 2
        assert store.last_round() == 3
        store.truncate_after(10)  # nothing after 10: no change
        assert store.rounds() == [0, 1, 2, 3]


# ----- reading -------------------------------------------------------------------------------


def test_iter_updates_streams_one_payload_per_step_in_id_order(tmp_path, monkeypatch):
    with HistoryStore.create(tmp_path, {}) as store:
        store.write_round(RoundEntry(0, global_model=payload(0)))
        ids = (5, 1, 3, 0)
        store.write_round(
            RoundEntry(
                1,
                updates={c: payload(c) for c in ids},
                clients=[ClientRecord(c, "accepted") for c in ids],
            )
        )
        reads = []
        original = HistoryStore._payload_row

        def counting(self, where, args):
            reads.append(args)
            return original(self, where, args)

        monkeypatch.setattr(HistoryStore, "_payload_row", counting)

        stream = store.iter_updates(1)
        assert inspect.isgenerator(stream)
        assert reads == []  # nothing read before the first step
        first_id, first = next(stream)
        assert len(reads) == 1
        rest = list(stream)

        assert [first_id] + [c for c, _ in rest] == [0, 1, 3, 5]
        assert all(torch.equal(u, payload(c)) for c, u in [(first_id, first), *rest])
        assert len(reads) == 4
        with pytest.raises(HistoryError, match="round 2 is not stored"):
            store.iter_updates(2)  # checked eagerly


def test_reader_sees_commits_of_a_writer_that_is_still_open(tmp_path):
    writer = build(tmp_path, rounds=1)
    with HistoryStore.open(tmp_path) as reader:
        assert reader.last_round() == 1
        writer.write_round(make_round(2))
        assert reader.last_round() == 2
        assert torch.equal(reader.read_update(2, 2), payload(2003))
    writer.close()


# ----- byte accounting -------------------------------------------------------------------------


def test_stored_bytes_is_the_exact_sum_of_tensor_bytes(tmp_path):
    with HistoryStore.create(tmp_path, {}) as store:
        m0 = torch.zeros(1000, dtype=torch.float64)
        updates = {0: torch.zeros(333), 2: torch.zeros(7, dtype=torch.float16), 9: torch.zeros(0)}
        store.write_round(RoundEntry(0, global_model=m0))
        store.write_round(
            RoundEntry(
                1,
                torch.zeros(10),
                torch.zeros(11),
                updates,
                [ClientRecord(c, "accepted") for c in updates] + [ClientRecord(4, "missing")],
            )
        )

        assert store.stored_bytes_by_kind() == {
            "global": 8000 + 40,
            "aggregate": 44,
            "update": 1332 + 14,
        }
        assert store.stored_bytes() == 8000 + 40 + 44 + 1332 + 14
        assert store.stored_bytes_by_client() == {0: 1332, 2: 14, 4: 0, 9: 0}
        assert store.file_bytes() > store.stored_bytes()


# ----- forgetting ------------------------------------------------------------------------------


def test_forget_deletes_the_payload_bytes_from_every_file(tmp_path):
    build(tmp_path, rounds=3).close()  # close: everything into the main file, no WAL
    store = HistoryStore.open(tmp_path, writable=True)
    forgotten = payload(2002)  # round 2, client 1
    pattern = forgotten[4000:4016].numpy().tobytes()  # 64 random bytes
    assert pattern in store_files_bytes(tmp_path)  # sanity: the pattern is findable
    expected = store.stored_bytes_by_client()[1]
    file_before = store.file_bytes()
    others_before = {(r, c): store.read_update(r, c) for r in (1, 2, 3) for c in (0, 2)}

    record = store.forget([1])

    assert record.size_bytes == expected == 3 * DIM * 4
    assert record.vacuum == "incremental"
    assert pattern not in store_files_bytes(tmp_path)  # db, -wal, -shm
    assert store.file_bytes() == record.file_bytes_after
    # the overflow pages went back to the file system; the ~7 kB of each payload kept in its
    # b-tree page is zeroed in place (that page also holds other rows)
    assert record.bytes_reclaimed >= 0.75 * record.size_bytes
    assert record.file_bytes_before == file_before
    assert store.stored_bytes_by_client() == {0: 3 * DIM * 4, 1: 0, 2: 3 * DIM * 4}
    with pytest.raises(
        ForgottenDataError, match="round 2 client 1: the update was deleted by forget"
    ):
        store.read_update(2, 1)
    assert not store.has_update(2, 1)
    assert [c for c, _ in store.iter_updates(2)] == [0, 2]
    assert [(r.client_id, r.stored) for r in store.client_records(2)] == [
        (0, True),
        (1, False),
        (2, True),
    ]
    assert all(torch.equal(store.read_update(r, c), t) for (r, c), t in others_before.items())
    log = store.forget_records()
    assert [(e.client_id, e.size_bytes, e.num_payloads) for e in log] == [(1, expected, 3)]
    assert abs(log[0].forgotten_at - time.time()) < 60
    store.verify()
    store.close()
    assert pattern not in store_files_bytes(tmp_path)
    with HistoryStore.open(tmp_path) as reopened, pytest.raises(ForgottenDataError):
        reopened.read_update(1, 1)


def test_deletion_record_holds_each_payloads_digest_taken_before_deletion(tmp_path):
    with build(tmp_path, rounds=3) as store:
        digests = {
            r: hashlib.sha256(payload(1000 * r + 2).numpy().tobytes()).hexdigest()
            for r in (1, 2, 3)
        }

        record = store.forget([1, 0])
        again = store.forget([1])

        assert record.client_ids == (0, 1)
        assert record.id == 1
        assert again.id == 2
        mine = [p for p in record.payloads if p.client_id == 1]
        assert [(p.round, p.size_bytes) for p in mine] == [(1, DIM * 4), (2, DIM * 4), (3, DIM * 4)]
        assert {p.round: p.sha256 for p in mine} == digests
        assert all(p.num_fingerprints >= 2 for p in record.payloads)  # 40 kB: 2+ overflow pages
        assert again.size_bytes == 0
        assert again.payloads == ()
        assert store.deletion_records() == [record, again]
        only_one = store.deletion_records([1])
        assert [p.client_id for r in only_one for p in r.payloads] == [1, 1, 1]
        as_json = json.loads(json.dumps(record.to_dict()))
        assert as_json["payloads"][3]["sha256"] == digests[1]
        assert as_json["bytes_reclaimed"] == record.file_bytes_before - record.file_bytes_after
    with HistoryStore.open(tmp_path) as reader:  # kept in the file
        assert reader.deletion_records() == [record, again]


def test_check_deletions_passes_after_forget_and_is_calibrated_on_live_pages(tmp_path):
    with build(tmp_path, rounds=3) as store:
        store.forget([1])

        result = store.check_deletions()

    assert result.ok, result.problems
    assert result.payloads_checked == result.unreadable == 3
    assert result.fingerprints_checked >= 6
    assert result.fingerprints_found == 0
    assert result.control_checked > 0
    assert result.control_found == result.control_checked


def test_check_deletions_finds_pages_left_behind(tmp_path, monkeypatch):
    """Without secure_delete and the vacuum, the freed pages keep the bytes: the scan sees them."""
    with build(tmp_path, rounds=3) as store:
        store._db.execute("PRAGMA secure_delete=OFF")
        monkeypatch.setattr(HistoryStore, "_incremental_vacuum", lambda self: None)
        store.forget([1])

        result = store.check_deletions([1])

    assert not result.ok
    assert result.unreadable == 3  # reads are refused all the same
    assert result.fingerprints_found > 0
    assert "round 1 client 1: a page of it is still in the files" in result.problems


def test_forget_needs_extra_disk_in_proportion_to_the_forgotten_bytes(tmp_path, monkeypatch):
    """Incremental: the WAL holds about the freed pages; full VACUUM: a copy of the whole file."""
    wal_peaks: list[int] = []
    original = HistoryStore._checkpoint_truncate

    def spy(self, consequence):
        wal = self.file.with_name(self.file.name + "-wal")
        wal_peaks.append(wal.stat().st_size if wal.exists() else 0)
        original(self, consequence)

    monkeypatch.setattr(HistoryStore, "_checkpoint_truncate", spy)
    build(tmp_path, rounds=4, clients=tuple(range(10))).close()  # the WAL starts empty
    with HistoryStore.open(tmp_path, writable=True) as store:
        size = store.file_bytes()

        wal_peaks.clear()
        fast = store.forget([3])
        fast_peak = max(wal_peaks)
        wal_peaks.clear()
        full = store.forget([4], vacuum="full")
        full_peak = max(wal_peaks)

    assert fast.size_bytes == full.size_bytes == 4 * DIM * 4  # one client: ~1/17 of the file
    assert fast.vacuum == "incremental"
    assert full.vacuum == "full"
    # forget() also drops the models that would rebuild the update (reconstruction.py)
    forgotten = fast.size_bytes + fast.model_bytes
    assert fast.model_bytes == 7 * DIM * 4  # aggregates of rounds 1..4, M_1..M_3
    assert fast_peak <= 3 * forgotten < 0.75 * size
    assert full_peak >= 0.8 * full.file_bytes_after  # VACUUM wrote the whole file again
    assert fast.bytes_reclaimed >= 0.75 * fast.size_bytes


def test_store_without_auto_vacuum_is_converted_by_its_first_forget(tmp_path):
    """A store written before auto_vacuum and the deletion tables existed: full VACUUM once."""
    build(tmp_path, rounds=2).close()
    con = sqlite3.connect(tmp_path / "history.sqlite", isolation_level=None)
    con.executescript(
        "DROP TABLE forget_payloads; DROP TABLE forget_calls; PRAGMA auto_vacuum=NONE; VACUUM;"
    )
    assert con.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
    con.close()
    with HistoryStore.open(tmp_path) as reader:  # read-only: no tables added, no records
        assert reader.deletion_records() == []

    with HistoryStore.open(tmp_path, writable=True) as store:
        first = store.forget([0])
        second = store.forget([1])
        assert store._db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
        assert store.check_deletions().ok

    assert (first.vacuum, second.vacuum) == ("full", "incremental")
    assert first.size_bytes == second.size_bytes == 2 * DIM * 4


def test_forget_twice_records_zero_bytes_and_forgotten_clients_cannot_be_stored_again(tmp_path):
    with build(tmp_path, rounds=1) as store:
        store.forget([0, 2])

        assert store.forget([2]).size_bytes == 0
        assert store.forget([]).size_bytes == 0
        assert len(store.deletion_records()) == 2  # forgetting nobody is not recorded
        with pytest.raises(HistoryError, match="client\\(s\\) 0, 2, which were forgotten"):
            store.write_round(make_round(2))
        store.write_round(make_round(2, clients=(1,)))
        assert store.rounds() == [0, 1, 2]


def test_forget_unknown_client_raises_and_changes_nothing(tmp_path):
    with build(tmp_path, rounds=2) as store:
        before = (store.stored_bytes_by_client(), store.rounds(), store.forget_records())

        with pytest.raises(
            UnknownClientError, match=r"client\(s\) 42 never appear.*known client ids: 0\.\.2"
        ):
            store.forget([1, 42])

        assert (store.stored_bytes_by_client(), store.rounds(), store.forget_records()) == before
        assert torch.equal(store.read_update(1, 1), payload(1002))


# ----- corruption and damage -----------------------------------------------------------------


def test_flipped_payload_byte_is_caught_by_read_and_verify(tmp_path):
    build(tmp_path, rounds=3).close()  # close: checkpoint everything into the main file
    file = tmp_path / "history.sqlite"
    raw = bytearray(file.read_bytes())
    where = raw.find(payload(2002)[5000:5016].numpy().tobytes())  # round 2 client 1
    assert where > 0
    raw[where + 7] ^= 0xFF
    file.write_bytes(bytes(raw))

    with HistoryStore.open(tmp_path) as store:
        with pytest.raises(
            HistoryCorruptError,
            match="round 2 client 1 fails its checksum.*retrain from round 1.*--resume --repair",
        ):
            store.read_update(2, 1)
        with pytest.raises(HistoryCorruptError) as verify_error:
            store.verify()
        assert torch.equal(store.read_update(2, 0), payload(2001))  # the rest still reads

    assert str(file) in str(verify_error.value)
    assert "round 2 client 1: fails its checksum;" in str(verify_error.value)
    assert "drops round 2 and later" in str(verify_error.value)


def test_check_names_the_first_bad_round_and_quick_check_reads_only_models(tmp_path):
    build(tmp_path, rounds=4).close()
    file = tmp_path / "history.sqlite"
    raw = bytearray(file.read_bytes())
    for seed in (3002, 4000):  # round 3 client 1, then the global model of round 4
        where = raw.find(payload(seed)[5000:5016].numpy().tobytes())
        raw[where + 3] ^= 0x10
    file.write_bytes(bytes(raw))

    with HistoryStore.open(tmp_path) as store:
        full = store.check()
        quick = store.check(full=False)

    assert not full.ok
    assert full.full
    assert full.first_bad_round == 3
    assert full.problems == (
        "round 3 client 1: fails its checksum",
        "round 4 global model: fails its checksum",
    )
    assert full.payloads_checked == 1 + 4 * 5 - 2  # M_0, then global, aggregate, 3 updates
    assert not quick.ok
    assert quick.first_bad_round == 4  # models only: client 1 not read
    assert quick.payloads_checked == 1 + 4 * 2 - 1
    assert json.loads(json.dumps(full.to_dict()))["first_bad_round"] == 3


def test_check_reports_catalog_inconsistencies(tmp_path):
    build(tmp_path, rounds=3).close()
    con = sqlite3.connect(tmp_path / "history.sqlite", isolation_level=None)
    con.execute("UPDATE clients SET status='missing' WHERE round=2 AND client_id=0")
    con.execute("DELETE FROM clients WHERE round=3 AND client_id=2")
    con.close()

    with HistoryStore.open(tmp_path) as store:
        result = store.check(full=False)

    assert result.first_bad_round == 2
    assert [p for p in result.problems if not p.startswith("chain: ")] == [
        "round 2 client 0: an update is stored but its record says missing",
        "round 3 client 2: an update is stored but its record says nothing",
    ]
    # the committed history sees both rows changed (chain.py)
    assert [p.split(":")[1] for p in result.problems if p.startswith("chain: ")] == [
        " round 2",
        " round 3",
    ]


def test_truncate_after_minus_one_drops_every_round(tmp_path):
    with build(tmp_path, rounds=2) as store:
        store.truncate_after(-1)

        assert store.rounds() == []
        assert store.stored_bytes() == 0
        store.write_round(RoundEntry(0, global_model=payload(0)))
        assert store.check().ok
        with pytest.raises(ConfigError, match="truncate_after round must be an int >= -1"):
            store.truncate_after(-2)


def test_writer_lock_taken_first_is_handed_to_create_and_released_by_close(tmp_path):
    lock = WriterLock.acquire(tmp_path)
    with pytest.raises(HistoryError, match="another writer holds"):
        HistoryStore.create(tmp_path, {})  # a second lock in the same process is refused too
    with pytest.raises(HistoryError, match="another writer holds"):
        WriterLock.acquire(tmp_path)

    store = HistoryStore.create(tmp_path, {"x": 1}, lock=lock)
    assert store.writable
    store.close()

    assert not lock.held
    other = tmp_path / "other"
    other.mkdir()
    stray = WriterLock.acquire(other)
    with pytest.raises(HistoryError, match="not held for this directory"):
        HistoryStore.open(tmp_path, lock=stray)
    assert not stray.held  # the store took it and let it go
    with HistoryStore.open(tmp_path, lock=WriterLock.acquire(tmp_path)) as again:
        assert again.writable
        assert again.meta == {"x": 1}


@pytest.mark.parametrize("keep", [0.5, 0.97])
def test_truncated_file_is_refused_on_open(tmp_path, keep):
    build(tmp_path, rounds=3).close()
    file = tmp_path / "history.sqlite"
    with file.open("r+b") as fh:
        fh.truncate(int(file.stat().st_size * keep))

    with pytest.raises(HistoryCorruptError, match="truncated: the header says") as error:
        HistoryStore.open(tmp_path)

    assert str(file) in str(error.value)


@pytest.mark.parametrize("content", [b"", b"hello", b"not a database at all\n" * 1000])
def test_file_that_is_not_sqlite_is_refused(tmp_path, content):
    (tmp_path / "history.sqlite").write_bytes(content)

    with pytest.raises(HistoryCorruptError, match="not a SQLite database") as error:
        HistoryStore.open(tmp_path, writable=True)

    assert str(tmp_path / "history.sqlite") in str(error.value)
    assert (tmp_path / "history.sqlite").read_bytes() == content  # untouched


def test_sqlite_file_without_our_tables_is_refused(tmp_path):
    con = sqlite3.connect(tmp_path / "history.sqlite")
    con.execute("CREATE TABLE other (x)")
    con.commit()
    con.close()

    with pytest.raises(HistoryCorruptError, match="not a fedunlearn history store"):
        HistoryStore.open(tmp_path)


def test_unknown_schema_version_is_refused(tmp_path):
    build(tmp_path, rounds=0).close()
    con = sqlite3.connect(tmp_path / "history.sqlite")
    con.execute("UPDATE info SET value='99' WHERE key='schema_version'")
    con.commit()
    con.close()

    with pytest.raises(
        HistoryError, match="schema version 99; this fedunlearn reads version 1"
    ) as error:
        HistoryStore.open(tmp_path)

    assert not isinstance(error.value, HistoryCorruptError)


def test_damaged_page_is_reported_as_corrupt_with_the_file_name(tmp_path):
    build(tmp_path, rounds=2).close()
    file = tmp_path / "history.sqlite"
    raw = bytearray(file.read_bytes())
    page = 16384
    raw[2 * page : 3 * page] = os.urandom(page)  # a b-tree page of the catalog
    file.write_bytes(bytes(raw))

    with pytest.raises(HistoryCorruptError) as error:
        with HistoryStore.open(tmp_path) as store:
            store.verify()

    assert str(file) in str(error.value)


# ----- access modes ----------------------------------------------------------------------------


def test_read_only_store_refuses_every_write(tmp_path):
    build(tmp_path, rounds=1).close()
    before = (tmp_path / "history.sqlite").read_bytes()

    with HistoryStore.open(tmp_path) as store:
        assert not store.writable
        for write in (
            lambda: store.write_round(make_round(2)),
            lambda: store.forget([0]),
            lambda: store.truncate_after(0),
            lambda: store.update_meta({"x": 1}),
        ):
            with pytest.raises(HistoryError, match="opened read-only"):
                write()
        assert store.rounds() == [0, 1]

    assert (tmp_path / "history.sqlite").read_bytes() == before


def test_second_writer_is_refused_until_the_first_closes(tmp_path):
    first = build(tmp_path, rounds=1)

    with pytest.raises(HistoryError, match="another writer holds"):
        HistoryStore.open(tmp_path, writable=True)
    with pytest.raises(HistoryError, match="another writer holds"):
        HistoryStore.create(tmp_path, {})
    with HistoryStore.open(tmp_path) as reader:  # readers are welcome
        assert reader.last_round() == 1
    first.close()
    with HistoryStore.open(tmp_path, writable=True) as second:
        second.write_round(make_round(2))
        assert second.last_round() == 2


def test_create_refuses_an_existing_store_and_open_a_missing_one(tmp_path):
    build(tmp_path, rounds=0).close()

    with pytest.raises(HistoryError, match="exists already"):
        HistoryStore.create(tmp_path, {})
    with pytest.raises(HistoryError, match="no history store here"):
        HistoryStore.open(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="JSON"):
        HistoryStore.create(tmp_path / "new", {"bad": object()})
    assert not (tmp_path / "new" / "history.sqlite").exists()


def test_closed_store_raises_history_error(tmp_path):
    store = build(tmp_path, rounds=1)
    store.close()
    store.close()  # idempotent

    with pytest.raises(HistoryError, match="closed"):
        store.rounds()
    with pytest.raises(HistoryError, match="closed"):
        store.write_round(make_round(2))


# ----- crashes ---------------------------------------------------------------------------------

_WRITER = """
import sys, torch
from pathlib import Path
from fedunlearn.history import ClientRecord, HistoryStore, RoundEntry
from fedunlearn.history.store import WriterLock
path, dim, clients = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
if (path / "history.sqlite").exists():
    store = HistoryStore.open(path, writable=True)
else:
    store = HistoryStore.create(path, {"trial": True})
    store.write_round(RoundEntry(0, global_model=torch.zeros(dim)))
print("ready", flush=True)
r = store.last_round() + 1
while True:
    ids = range(clients)
    store.write_round(RoundEntry(
        r, torch.full((dim,), float(r)), None,
        {c: torch.full((dim,), float(1000 * r + c)) for c in ids},
        [ClientRecord(c, "accepted", num_samples=r) for c in ids], {"round": r}))
    print(r, flush=True)
    r += 1
"""


@pytest.mark.slow
def test_kill_9_during_writes_never_loses_or_tears_a_committed_round(tmp_path):
    rng = random.Random(20240517)
    dim, clients = 250_000, 6  # 1 MB per update, 7 MB per round
    acknowledged = 0
    for trial in range(5):
        child = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(tmp_path), str(dim), str(clients)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout.readline().strip() == "ready"
        # let the writer commit a few rounds first (a loaded machine may be slow to start it),
        # then kill it at a random moment of a later write
        seen = [int(child.stdout.readline()) for _ in range(1 + trial % 2)]
        time.sleep(rng.uniform(0.0, 0.3))
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        lines = child.stdout.read().split()
        acknowledged = max([acknowledged, *seen, *map(int, lines)])

        with HistoryStore.open(tmp_path) as store:  # read-only, over the crashed WAL
            last = store.last_round()
            assert last >= acknowledged  # every round write_round returned for is there
            assert store.rounds() == list(range(last + 1))
            for r in range(1, last + 1):
                assert [c.client_id for c in store.client_records(r)] == list(range(clients))
                assert all(c.stored and c.num_samples == r for c in store.client_records(r))
                assert store.round_scalars(r) == {"round": r}
                assert torch.equal(store.read_model(r), torch.full((dim,), float(r)))
                for c, update in store.iter_updates(r):
                    assert torch.equal(update, torch.full((dim,), float(1000 * r + c)))
            assert store.stored_bytes() == dim * 4 * (1 + last * (clients + 1))
            store.verify()

    assert acknowledged >= 3  # the writer really got going between kills


def test_module_all_names_import():
    for name in store_module.__all__:
        assert hasattr(store_module, name)
