"""The job a deployment's links are bound to: equal at servers and clients, differences named."""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import zlib

import pytest
from starfish_support import small_run_config

from fedunlearn.config import parse_config
from fedunlearn.errors import ConfigError, HistoryCorruptError, UnsupportedHistoryError
from fedunlearn.history.store import HistoryStore
from fedunlearn.mpc import FixedPoint, InProcessTransport, Party
from fedunlearn.runs import HISTORY_DIR, load_run_config, train_run
from fedunlearn.unlearn import make_method
from fedunlearn.unlearn.context import CostMeter, MeteredHistory
from fedunlearn.unlearn.starfish.deploy.binding import (
    JOB_FIELDS,
    PAYLOAD_DIGESTS_KEY,
    PayloadManifest,
    check_deployable,
    config_digest,
    read_sharing,
    sharing_digest,
    starfish_binding,
)
from fedunlearn.unlearn.starfish.deploy.shares import (
    SharedStageOneRecord,
    ensure_shares,
    share_meta,
    share_store_dir,
)

METHOD = make_method("starfish", {"backend": "mpc"})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("starfish_binding") / "run"
    train_run(parse_config(small_run_config(seed=3, rounds=4)), path)
    ensure_shares(path, METHOD)
    return path


def server_binding(run_dir, party, forget=(0,), method=METHOD, session="s-1"):
    with HistoryStore.open(share_store_dir(run_dir, party)) as store:
        return starfish_binding(
            session,
            config=load_run_config(run_dir),
            forget=forget,
            method=method,
            history=store,
            sharing=share_meta(store),
        )


def clients_binding(run_dir, forget=(0,)):
    with HistoryStore.open(run_dir / HISTORY_DIR) as store:
        return starfish_binding(
            "s-1",
            config=load_run_config(run_dir),
            forget=forget,
            method=METHOD,
            history=store,
            sharing=read_sharing(run_dir),
        )


def test_both_servers_and_the_clients_compute_the_same_binding(run_dir):
    first, second, clients = (
        server_binding(run_dir, 0),
        server_binding(run_dir, 1),
        clients_binding(run_dir),
    )
    assert first == second == clients
    assert tuple(first.digests) == tuple(sorted(JOB_FIELDS))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"forget": (1,)}, "digest forget_set"),
        ({"method": make_method("starfish", {"selection_rate": 0.8})}, "digest method"),
        ({"session": "s-2"}, "session_id"),
    ],
    ids=["forget", "method", "session"],
)
def test_a_different_job_differs_exactly_in_the_field_that_changed(run_dir, change, field):
    ours = server_binding(run_dir, 0)
    theirs = server_binding(run_dir, 1, **change)
    assert list(ours.differences(theirs)) == [field]


def test_a_share_store_of_another_sharing_differs_in_share_store_only(run_dir, tmp_path):
    # Prepare: a copy of the run, shared again (fresh masks, fresh sharing id)
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    ensure_shares(copy, METHOD, force=True)

    # Execute / Assert: server 1 of the new sharing against server 0 of the old one
    differences = server_binding(run_dir, 0).differences(server_binding(copy, 1))
    assert list(differences) == ["digest share_store"]
    assert read_sharing(copy)["sharing_id"] != read_sharing(run_dir)["sharing_id"]


def test_the_local_data_directory_is_not_part_of_the_job(run_dir):
    config = load_run_config(run_dir)
    moved = config.model_copy(update={"data": config.data.model_copy(update={"data_dir": "/x"})})
    assert config_digest(moved) == config_digest(config)


def test_shares_without_a_sharing_id_must_be_made_again():
    with pytest.raises(UnsupportedHistoryError, match="starfish-share RUN --force"):
        sharing_digest({"frac_bits": 16})


def test_ideal_comparisons_are_refused_in_a_deployment():
    check_deployable(METHOD)
    with pytest.raises(ConfigError, match=r"learn d \(G\^2 - delta\^2"):
        check_deployable(make_method("starfish", {"backend": "mpc", "comparison": "ideal"}))


class Tampered:
    """A store whose round-2 model (or round-2 participants) is not the recorded one."""

    def __init__(self, store, what):
        self.store, self.what = store, what

    def read_model(self, round, kind="global"):
        model = self.store.read_model(round, kind)
        return model + 1e-6 if self.what == "model" and round == 2 else model

    def client_records(self, round):
        records = self.store.client_records(round)
        return records[1:] if self.what == "participants" and round == 2 else records


@pytest.mark.parametrize("what", ["config", "model", "participants"])
def test_another_config_or_trajectory_differs_in_that_field_only(run_dir, what):
    # Prepare: server 1's view of the job changed in one place
    config = load_run_config(run_dir)
    if what == "config":
        training = config.training.model_copy(update={"lr": config.training.lr * 2})
        config = config.model_copy(update={"training": training})
    with HistoryStore.open(share_store_dir(run_dir, 1)) as store:
        history = store if what == "config" else Tampered(store, what)

        # Execute
        theirs = starfish_binding(
            "s-1", config=config, forget=(0,), method=METHOD, history=history,
            sharing=share_meta(store),
        )  # fmt: skip

    # Assert
    field = "digest run_config" if what == "config" else "digest trajectory"
    assert list(server_binding(run_dir, 0).differences(theirs)) == [field]


# ---- the binding lasts: every share payload is checked on read (issue 25) ----------------------


def edit_share(store_dir, round_, client_id):
    """Change one stored share in place, as someone with write access to the store could.

    The CRC-32 is recomputed, so the store's own checksum does not notice the edit.
    """
    con = sqlite3.connect(store_dir / "history.sqlite")
    try:
        query = "SELECT data FROM payloads WHERE round=? AND kind='update' AND client_id=?"
        (data,) = con.execute(query, (round_, client_id)).fetchone()
        edited = bytearray(data)
        edited[0] ^= 0xFF  # one coordinate of the share changes: the opened value would too
        con.execute(
            "UPDATE payloads SET data=?, crc32=? WHERE round=? AND kind='update' AND client_id=?",
            (bytes(edited), zlib.crc32(edited), round_, client_id),
        )
        con.commit()
    finally:
        con.close()


def shared_record(store, party_id, sharing=None):
    party = Party(party_id, InProcessTransport.pair()[party_id], 3, fixed_point=FixedPoint(16))
    return SharedStageOneRecord(MeteredHistory(store, CostMeter()), party, sharing)


def test_a_share_edited_after_the_handshake_is_refused_on_read(run_dir, tmp_path):
    # Prepare: a copy of the run; server 0 binds its session (the handshake), then its share
    # of round 2, client 1 is edited in the SQLite file
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    store_dir = share_store_dir(run, 0)
    with HistoryStore.open(store_dir) as store:
        bound = share_meta(store)
    before = server_binding(run, 0)
    edit_share(store_dir, 2, 1)

    # Execute / Assert: the session's binding is unchanged (the edit touched no metadata) ...
    assert server_binding(run, 0) == before
    with HistoryStore.open(store_dir) as store:
        record = shared_record(store, 0, bound)
        record.update(2, 2)  # an unedited share reads as before
        with pytest.raises(HistoryCorruptError, match="not the one bound into the session"):
            record.update(2, 1)
        with pytest.raises(HistoryCorruptError, match="round 2 client 1"):
            record.norm(2, 1)


def test_a_rewritten_manifest_cannot_pass_for_the_bound_sharing(run_dir, tmp_path):
    # Prepare: the attacker also rewrites the store's digest of the edited share
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    store_dir = share_store_dir(run, 1)
    with HistoryStore.open(store_dir) as store:
        bound = share_meta(store)
    edit_share(store_dir, 3, 2)
    with HistoryStore.open(store_dir, writable=True) as store:
        info = share_meta(store)
        edited = store.read_update(3, 2)
        info[PAYLOAD_DIGESTS_KEY]["3:2"] = PayloadManifest.payload_digest(edited)
        store.update_meta({"starfish_shares": info})

    # Execute / Assert: against the sharing bound at the handshake the edit is refused; a
    # session bound afresh to the rewritten store no longer matches the clients' binding
    with HistoryStore.open(store_dir) as store:
        with pytest.raises(HistoryCorruptError, match="not the one bound into the session"):
            shared_record(store, 1, bound).update(3, 2)
        with pytest.raises(HistoryCorruptError, match="changed after Stage I"):
            shared_record(store, 1)  # its own manifest no longer hashes to the bound root
    assert sharing_digest(bound) == sharing_digest(read_sharing(run))


def test_every_share_payload_is_bound_into_the_session(run_dir):
    # each server's manifest root is part of the sharing record all three processes bind to
    roots = []
    for party in (0, 1):
        with HistoryStore.open(share_store_dir(run_dir, party)) as store:
            info = share_meta(store)
            manifest = PayloadManifest.of_sharing(info, party)
            assert len(manifest.digests) == sum(
                rec.status == "accepted"
                for r in store.rounds()[1:]
                for rec in store.client_records(r)
            )
            roots.append(manifest.root())
    assert read_sharing(run_dir)["payloads"] == roots
    other = {**read_sharing(run_dir), "payloads": [roots[0], "0" * 64]}
    assert sharing_digest(other) != sharing_digest(read_sharing(run_dir))


def test_share_stores_are_private_whatever_the_umask(run_dir, tmp_path):
    # Prepare: a permissive umask, as issue 25 found the stores world-readable
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    old = os.umask(0)
    try:
        # Execute
        ensure_shares(run, METHOD, force=True)
        with HistoryStore.open(share_store_dir(run, 0)):
            pass  # a reader's own files (WAL, lock) appear under the private directory
    finally:
        os.umask(old)

    # Assert
    for party in (0, 1):
        directory = share_store_dir(run, party)
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, oct(directory.stat().st_mode)
        for item in directory.iterdir():
            if item.name.startswith("history.sqlite") and item.is_file():
                assert stat.S_IMODE(item.stat().st_mode) & 0o077 == 0, (
                    item,
                    oct(item.stat().st_mode),
                )
