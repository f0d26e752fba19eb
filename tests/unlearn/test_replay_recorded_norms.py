"""Calibrated replay takes ||stored delta|| from the records, not by reading each update (issue 35).

The recorder computes a client record's norm from the tensor it stores, so FedEraser's and
Crab's whole-vector calibration needs no payload read: these tests check the replay is bit for
bit the one that reads every update (a store whose records carry no norm), and reads less.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fedunlearn.history.store import HistoryStore
from fedunlearn.runs import HISTORY_DIR
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method, replay
from fedunlearn.unlearn.replay import (
    calibrate,
    calibrate_to,
    recorded_norms,
    records_describe_stored_updates,
)

FORGET = UnlearnRequest.of([1])


@pytest.mark.slow  # a run and four sessions (about 10 s on a busy 2-core box)
@pytest.mark.parametrize("method", ["federaser", "crab"])
def test_replay_with_recorded_norms_is_bit_identical_and_reads_no_calibration_update(
    convex_run, method, monkeypatch
):
    # derived_cache=False: Crab's second run would read the selection the first derived, and
    # save those reads too; the comparison is of the calibration's reads alone
    with UnlearnSession(convex_run, evaluate=False, derived_cache=False) as session:
        new = session.run(make_method(method), FORGET)
        # a store whose records carry no norm: every calibration reads the stored update
        monkeypatch.setattr(replay, "recorded_norms", lambda context, round_: {})
        old = session.run(make_method(method), FORGET)
    assert new.params.numpy().tobytes() == old.params.numpy().tobytes()
    assert new.costs.client_epochs == old.costs.client_epochs
    # the norm is the stored update's: the lineage names that update as read (before: not)
    assert new.lineage is not None
    assert new.lineage.to_dict() == old.lineage.to_dict()
    assert new.trajectory is not None
    assert old.trajectory is not None
    assert len(new.trajectory.rounds) == len(old.trajectory.rounds)
    for a, b in zip(new.trajectory.rounds, old.trajectory.rounds, strict=True):
        assert torch.equal(a.global_model, b.global_model)
        assert a.updates.keys() == b.updates.keys()
        assert all(torch.equal(a.updates[c], b.updates[c]) for c in a.updates)
        assert a.clients == b.clients
    calibrated = sum(len(r.updates) for r in new.trajectory.rounds)
    with HistoryStore.open(convex_run / HISTORY_DIR) as store:
        p = store.read_model(0).numel()
    # before: one read of every calibrated client's stored update
    saved = old.costs.history_bytes_read - new.costs.history_bytes_read
    assert saved >= calibrated * p * 4 // 2 > 0


@pytest.mark.parametrize("scale", [0.0, 1e-13, 0.5, 3.0])
def test_calibrate_to_a_given_norm_equals_calibrate_bit_for_bit(scale):
    g = torch.Generator().manual_seed(7)
    stored, fresh = torch.randn(257, generator=g), torch.randn(257, generator=g) * scale
    assert torch.equal(calibrate_to(float(stored.norm()), fresh), calibrate(stored, fresh))


@pytest.mark.parametrize(
    ("meta", "exact"),
    [
        ({}, True),
        ({"update_encoding": "float32"}, True),
        # a float16 run recorded before the recorder took the records of the stored copies
        ({"update_encoding": "float16"}, False),
        ({"update_encoding": "float16", "records_of_stored_copy": True}, True),
    ],
)
def test_records_stand_for_the_stored_updates_where_the_store_says_they_do(meta, exact):
    record = SimpleNamespace(client_id=4, stored=True, status="accepted", norm=2.5)
    history = SimpleNamespace(meta=meta, client_records=lambda round_: [record])
    context = SimpleNamespace(history=history)
    assert records_describe_stored_updates(context) is exact
    # an old float16 store's update differs from the float32 delta the record's norm was taken of
    assert recorded_norms(context, 1) == ({4: 2.5} if exact else {})
