"""The committed history (issue 34): a hash chain over every stored round, forget and apply.

``forget`` and ``apply`` keep the chain whole (their links commit what they removed); a payload,
a round or a deletion record removed or added outside them (raw SQL), whatever went with it,
breaks it; an old store without a chain opens and says so.
"""

from __future__ import annotations

import json
import os
import sqlite3
import zlib
from pathlib import Path

import pytest
import torch
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedunlearn.errors import ConfigError, IntegrityError
from fedunlearn.history.store import ClientRecord, HistoryStore, RoundEntry
from fedunlearn.history.store.chain import GENESIS_PREV


def _round(r: int, clients=(0, 1, 2), updates=True) -> RoundEntry:
    return RoundEntry(
        r,
        global_model=torch.full((6,), float(r)),
        aggregate=torch.full((6,), 0.5 * r),
        clients=[ClientRecord(c, "accepted", 10 + c) for c in clients],
        updates={c: torch.full((6,), r + c / 10) for c in clients} if updates else {},
    )


def _build(path: Path, rounds: int = 3) -> None:
    with HistoryStore.create(path, {"seed": 1}) as store:
        store.write_round(RoundEntry(0, global_model=torch.zeros(6)))
        for r in range(1, rounds + 1):
            store.write_round(_round(r))


def _check(path: Path):
    with HistoryStore.open(path) as store:
        return store.check(full=True)


def _sql(path: Path, *statements: str) -> None:
    con = sqlite3.connect(path / "history.sqlite", isolation_level=None)
    try:
        for statement in statements:
            con.execute(statement)
    finally:
        con.close()


def _chain_lines(check) -> list[str]:
    return [p for p in check.problems if p.startswith("chain: ")]


def test_links_commit_every_round_and_verify(tmp_path):
    _build(tmp_path)
    with HistoryStore.open(tmp_path) as store:
        links = store.chain_links()
        check = store.check_chain()
        head = store.chain_head()
    assert [kind for _, kind, _, _ in links] == ["genesis", "round", "round", "round", "round"]
    assert links[0][2]["prev"] == GENESIS_PREV
    assert [body["prev"] for _, _, body, _ in links[1:]] == [link for *_, link in links[:-1]]
    round2 = links[3][2]
    assert round2["round"] == 2
    assert round2["rounds"]["2"]["clients"] == [
        [0, "accepted", 10, None],
        [1, "accepted", 11, None],
        [2, "accepted", 12, None],
    ]
    assert len(round2["payloads"]) == 5  # global, aggregate, three updates
    assert check.ok
    assert check.present
    assert check.links == 5
    assert check.payloads_hashed == 16
    assert head is not None
    assert (head.seq, head.link) == (5, links[-1][3])


def test_forget_keeps_the_chain_whole_and_commits_what_it_removed(tmp_path):
    _build(tmp_path)
    with HistoryStore.open(tmp_path, writable=True) as store:
        record = store.forget([1])
        check = store.check(full=True)
        last = store.chain_links()[-1]
    assert check.ok, check.problems
    assert last[1] == "forget"
    assert last[2]["clients"] == [1]
    removed = {(r, k, c): sha for r, k, c, sha in last[2]["removed"]}
    assert {(p.round, "update", p.client_id) for p in record.payloads} <= set(removed)
    assert all(removed[(p.round, "update", p.client_id)] == p.sha256 for p in record.payloads)


def test_attached_updates_and_truncate_keep_the_chain_whole(tmp_path):
    with HistoryStore.create(tmp_path, {"seed": 1}) as store:
        store.write_round(RoundEntry(0, global_model=torch.zeros(6)))
        store.write_round(_round(1, updates=False))
        store.write_round(_round(2), attach={1: {0: torch.ones(6)}})
        store.write_round(_round(3))
        store.truncate_after(2)
        store.write_round(_round(3, clients=(0,)))
        assert store.check(full=True).ok
        kinds = [kind for _, kind, _, _ in store.chain_links()]
    assert kinds[-2:] == ["truncate", "round"]


def test_apply_trajectory_and_model_keep_the_chain_whole(tmp_path):
    _build(tmp_path)
    with HistoryStore.open(tmp_path, writable=True) as store:
        store.apply(
            forget=[2],
            new=[2],
            method="retrain",
            request_kind="forget",
            model=torch.full((6,), 9.0),
            model_sha256="a" * 64,
            trajectory=[_round(1, (0, 1)), _round(2, (0, 1))],
        )
        assert store.check(full=True).ok
        store.apply(
            forget=[1, 2],
            new=[1],
            method="x",
            request_kind="forget",
            model=torch.full((6,), 7.0),
            model_sha256="b" * 64,
        )
        check = store.check(full=True)
        applies = [body for _, kind, body, _ in store.chain_links() if kind == "apply"]
    assert check.ok, check.problems
    assert [a["event"]["method"] for a in applies] == ["retrain", "x"]
    assert applies[0]["drop_after"] == 0
    assert "drop_after" not in applies[1]
    assert {c for r, _, c, _ in applies[0]["removed"]} == {2}


@pytest.mark.parametrize("ledger", [False, True])
def test_a_payload_deleted_by_raw_sql_breaks_the_chain(tmp_path, ledger):
    _build(tmp_path)
    also = [
        "DELETE FROM payload_prints WHERE round=2 AND client_id=1",
        "UPDATE clients SET stored_at=NULL WHERE round=2 AND client_id=1",
    ]
    _sql(
        tmp_path,
        "DELETE FROM payloads WHERE round=2 AND kind='update' AND client_id=1",
        *(also if ledger else []),
    )
    check = _check(tmp_path)
    assert not check.ok
    assert check.first_bad_round == 2
    assert _chain_lines(check) == [
        "chain: round 2 client 1: committed, but gone with no deletion record (removed outside "
        "forget)"
    ]
    assert check.chain["ok"] is False


def test_a_rounds_rows_deleted_by_raw_sql_break_the_chain(tmp_path):
    _build(tmp_path)
    _sql(
        tmp_path,
        "DELETE FROM payloads WHERE round=3",
        "DELETE FROM payload_prints WHERE round=3",
        "DELETE FROM clients WHERE round=3",
        "DELETE FROM rounds WHERE round=3",
    )
    check = _check(tmp_path)
    assert not check.ok
    assert _chain_lines(check) == [
        "chain: round 3: committed, but its rows and 5 payload(s) are gone with no deletion "
        "record (removed outside forget)"
    ]


def test_a_replaced_payload_with_a_fresh_checksum_breaks_the_chain(tmp_path):
    _build(tmp_path)
    data = torch.full((6,), 42.0).numpy().tobytes()
    _sql(
        tmp_path,
        f"UPDATE payloads SET data=X'{data.hex()}', crc32={zlib.crc32(data)} "
        "WHERE round=1 AND kind='global'",
    )
    check = _check(tmp_path)
    assert [p for p in check.problems] == [
        "chain: round 1 global model: its bytes differ from the committed SHA-256 (replaced "
        "after it was written)"
    ]


def test_deletion_records_removed_or_forged_break_the_chain(tmp_path):
    _build(tmp_path)
    with HistoryStore.open(tmp_path, writable=True) as store:
        store.forget([0])
    _sql(tmp_path, "DELETE FROM forget_payloads WHERE round=2 AND client_id=0")
    assert _chain_lines(_check(tmp_path)) == [
        "chain: the deletion record of round 2 client 0 is gone or changed"
    ]
    _sql(
        tmp_path,
        "INSERT INTO forget_payloads SELECT call_id, round, 2, size_bytes, sha256, fingerprints "
        "FROM forget_payloads WHERE round=1 AND client_id=0",
    )
    assert (
        "chain: a deletion record of round 1 client 2 is not in the committed history "
        "(added outside forget)" in _check(tmp_path).problems
    )


def test_an_edited_or_cut_link_breaks_the_chain(tmp_path):
    _build(tmp_path)
    _sql(tmp_path, "UPDATE chain SET body=replace(body, '\"round\":2', '\"round\":7') WHERE seq=4")
    assert _chain_lines(_check(tmp_path))[0] == (
        "chain: link 4 (round) does not match its SHA-256: it was edited"
    )
    _build(tmp_path / "b")
    _sql(tmp_path / "b", "DELETE FROM chain WHERE seq=3")
    assert _chain_lines(_check(tmp_path / "b"))[0].startswith("chain: link 3 is missing")
    _sql(tmp_path / "b", "DROP TABLE chain")
    assert _chain_lines(_check(tmp_path / "b")) == [
        "chain: the chain table is gone: the committed history was removed"
    ]


def test_a_store_written_before_the_chain_opens_and_says_it_has_none(tmp_path):
    _build(tmp_path)
    _sql(tmp_path, "DROP TABLE chain", "DELETE FROM info WHERE key='chain'")
    with HistoryStore.open(tmp_path, writable=True) as store:
        store.write_round(_round(4))  # an old store keeps working, without a chain
        check = store.check(full=True)
        assert store.chain_head() is None
        assert store.chain_links() == []
    assert check.ok
    assert check.chain == {
        "present": False,
        "ok": True,
        "links": 0,
        "head": None,
        "payloads_hashed": 0,
        "problems": [],
    }


# ----- signed heads ------------------------------------------------------------------------------


def _keys(tmp_path: Path, mode: int = 0o600) -> tuple[Path, Path]:
    key = Ed25519PrivateKey.generate()
    private = tmp_path / "server_key"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    os.chmod(private, mode)
    public = tmp_path / "server_key.pub"
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
    )
    return private, public


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from fedunlearn.config import parse_config
    from fedunlearn.runs import train_run

    out = tmp_path_factory.mktemp("chain") / "run"
    config = {
        "seed": 1,
        "data": {"dataset": "digits", "num_clients": 4},
        "model": {"name": "logreg"},
        "training": {"rounds": 2, "local_epochs": 1, "batch_size": 64, "executor": "serial"},
        "history": {"policy": "all"},
    }
    train_run(parse_config(config), out)
    return out


@pytest.mark.slow
def test_a_signed_head_verifies_with_the_servers_key_only(tiny_run, tmp_path):
    from fedunlearn.runs.chain_signing import check_signed_head, sign_head

    private, public = _keys(tmp_path)
    doc = json.loads(json.dumps(sign_head(tiny_run, private)))
    with HistoryStore.open(tiny_run / "history") as store:
        head = store.chain_head()
    assert (doc["statement"]["seq"], doc["statement"]["head"]) == (head.seq, head.link)
    assert check_signed_head(doc, public, tiny_run)["head"] == head.link
    (tmp_path / "other").mkdir()
    _, other = _keys(tmp_path / "other")
    with pytest.raises(IntegrityError, match="does not verify with this public key"):
        check_signed_head(doc, other, tiny_run)
    doc["statement"]["seq"] = 1  # an edited statement
    with pytest.raises(IntegrityError, match="does not verify"):
        check_signed_head(doc, public, tiny_run)


def test_a_signing_key_others_may_read_is_refused(tmp_path):
    from fedunlearn.runs.chain_signing import sign_head

    private, _ = _keys(tmp_path, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        sign_head(tmp_path, private)  # refused before the run is read
