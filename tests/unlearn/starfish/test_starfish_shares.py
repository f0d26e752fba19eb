"""Stage I share stores: one per server, uniform shares that open together, read back as shares."""

import sqlite3

import numpy as np
import pytest
import torch
from starfish_support import two_party

from fedunlearn.errors import HistoryError
from fedunlearn.history.store import HistoryStore
from fedunlearn.mpc import FixedPoint
from fedunlearn.unlearn.context import CostMeter, MeteredHistory
from fedunlearn.unlearn.starfish.deploy.shares import (
    SharedStageOneRecord,
    share_history,
    share_meta,
    share_store_dir,
)


@pytest.fixture(scope="module")
def run_dir(convex_run):
    return convex_run


def test_share_stores_hold_only_uniform_shares_that_open_together(run_dir, tmp_path):
    dirs = [tmp_path / "s0", tmp_path / "s1"]
    with HistoryStore.open(run_dir / "history") as plain:
        share_history(plain, dirs, lr=0.05, frac_bits=13, tolerance_rate=0.4, seed=1)
        rounds = plain.last_round()
        deltas = {
            (r, c): d.double().numpy()
            for r in range(1, rounds + 1)
            for c, d in plain.iter_updates(r)
        }
    fp = FixedPoint(13)
    stores = [HistoryStore.open(d) for d in dirs]
    try:
        assert [share_meta(s)["party"] for s in stores] == [0, 1]
        for (r, c), delta in deltas.items():
            gradient = -delta / 0.05
            s0, s1 = (s.read_update(r, c).numpy() for s in stores)
            opened = fp.decode(s0 + s1)
            np.testing.assert_allclose(opened[:-2], gradient, atol=2**-13)
            np.testing.assert_allclose(opened[-2], np.linalg.norm(gradient), rtol=1e-4)
            assert opened[-1] == pytest.approx(np.quantile(np.abs(gradient), 0.6), abs=2**-12)
            for share in (s0, s1):  # alone, a share is uniform: no trace of the update
                alone = fp.decode(share)[:-2]
                assert np.abs(alone).mean() > 1e6 * np.abs(gradient).mean()
                assert abs(np.corrcoef(alone, gradient)[0, 1]) < 0.5
        for store in stores:  # public data as in the run; no plaintext norm or loss kept
            recs = store.client_records(1)
            assert all(rec.norm is None and rec.loss is None for rec in recs)
            torch.testing.assert_close(store.read_model(rounds), plain_model(run_dir, rounds))
    finally:
        for store in stores:
            store.close()
    for d in dirs:  # the raw file holds no plaintext update bytes
        raw = (d / "history.sqlite").read_bytes()
        for delta in list(deltas.values())[:20]:
            assert delta.astype(np.float32).tobytes()[:32] not in raw


def plain_model(run_dir, round_):
    with HistoryStore.open(run_dir / "history") as store:
        return store.read_model(round_)


def test_shared_record_wraps_one_servers_shares(run_dir, tmp_path):
    dirs = [share_store_dir(tmp_path, 0), share_store_dir(tmp_path, 1)]
    with HistoryStore.open(run_dir / "history") as plain:
        share_history(plain, dirs, lr=0.05, frac_bits=13, seed=2)
        with pytest.raises(HistoryError, match="exists already"):
            share_history(plain, dirs, lr=0.05, frac_bits=13, seed=2)
        expected = -plain.read_update(3, 2).double().numpy() / 0.05

    def program(party):
        with HistoryStore.open(dirs[party.party_id]) as store:
            record = SharedStageOneRecord(MeteredHistory(store, CostMeter()), party)
            return record.update(3, 2).reveal(), float(record.norm(3, 2).reveal())

    (update, norm), _ = two_party(program)
    np.testing.assert_allclose(update, expected, atol=2**-13)
    assert norm == pytest.approx(np.linalg.norm(expected), rel=1e-4)


def test_share_store_is_a_valid_sqlite_history(run_dir, tmp_path):
    dirs = [tmp_path / "a", tmp_path / "b"]
    with HistoryStore.open(run_dir / "history") as plain:
        share_history(plain, dirs, lr=0.05, seed=3)
    for d in dirs:
        with HistoryStore.open(d) as store:
            store.verify()
        con = sqlite3.connect(d / "history.sqlite")
        kinds = {
            row[0] for row in con.execute("SELECT DISTINCT dtype FROM payloads WHERE kind='update'")
        }
        con.close()
        assert kinds == {"uint64"}
