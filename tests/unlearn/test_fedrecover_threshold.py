"""FedRecover's threshold tau from the recorded ||update||_inf (issue 35: one read, not two).

The recorder keeps each accepted update's largest |coordinate| (``MAX_ABS_KEY``); tau's pass
then reads only the updates that can hold one of a round's k largest values. These tests check
that tau, the replay and its details are bit-identical to the full pass (the path a run recorded
without the statistic takes), and that the pass reads at most k updates a round.
"""

from __future__ import annotations

import math

import pytest
import torch

from fedunlearn.config import parse_config
from fedunlearn.history.policy import MAX_ABS_KEY
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method
from fedunlearn.unlearn.baselines import fedrecover
from fedunlearn.unlearn.baselines.fedrecover import (
    _kth_largest_abs_of,
    kth_largest_abs,
    round_thresholds,
)

ROUNDS = 14
RUN = {
    "seed": 3,
    "data": {
        "dataset": "synthetic",
        "num_clients": 24,
        "partition": "dirichlet",
        "alpha": 0.5,
        "options": {"num_samples": 960, "num_features": 10, "num_classes": 3},
    },
    "model": {"name": "logreg"},
    "training": {
        "rounds": ROUNDS,
        "participation": 0.5,
        "local_epochs": 1,
        "lr": 0.05,
        "batch_size": 40,
        "executor": "serial",
    },
    "history": {"policy": "all"},
}
# estimated rounds 4..12 but 8; alpha gives k = 2 of 11-12 updates x 33 values a round
PARAMS = {"warmup_rounds": 3, "correction_period": 5, "final_rounds": 2, "alpha": 0.004}


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    run_dir = tmp_path_factory.mktemp("fedrecover-tau") / "run"
    train_run(parse_config(RUN), run_dir)
    with UnlearnSession(run_dir, evaluate=False) as opened:
        yield opened
    torch.set_num_threads(before)


def _forget(session: UnlearnSession) -> UnlearnRequest:
    first = [c.client_id for c in session.run_view.store.client_records(1)]
    return UnlearnRequest.of([first[0]])


@pytest.mark.slow  # trains a run (7 s on a busy 2-core box)
def test_the_recorder_keeps_each_updates_largest_coordinate(session):
    store = session.run_view.store
    for r in (1, ROUNDS):
        records = [c for c in store.client_records(r) if c.status == "accepted"]
        assert records
        for rec in records:
            expected = float(store.read_update(r, rec.client_id).abs().max())
            assert rec.scalars[MAX_ABS_KEY] == expected


@pytest.mark.slow  # trains a run (7 s on a busy 2-core box)
def test_tau_from_the_recorded_maxima_equals_the_full_pass_and_reads_at_most_k_a_round(
    session, monkeypatch
):
    request = _forget(session)
    context = session.context(request)
    method = make_method("fedrecover", PARAMS)
    participants, maxima = method._participants(context)
    assert all(set(maxima[r]) == set(ids) for r, ids in participants.items())
    full = round_thresholds(context, participants, PARAMS["alpha"])
    full_bytes = context.meter.costs.history_bytes_read
    pruned = round_thresholds(context, participants, PARAMS["alpha"], maxima)
    pruned_bytes = context.meter.costs.history_bytes_read - full_bytes
    assert pruned == full  # bit for bit, every round
    p = context.clients.num_params
    assert full_bytes == sum(len(ids) for ids in participants.values()) * p * 4
    ks = [math.floor(PARAMS["alpha"] * len(ids) * p) + 1 for ids in participants.values()]
    assert set(ks) == {2}
    assert pruned_bytes <= 2 * ROUNDS * p * 4  # before: every update, 11-12 a round
    # records not of the stored copies (a float16 run recorded before they were): not taken
    monkeypatch.setattr(fedrecover, "records_describe_stored_updates", lambda context: False)
    assert method._participants(context) == (participants, {r: {} for r in participants})


@pytest.mark.slow  # trains a run (7 s on a busy 2-core box)
def test_replay_with_the_recorded_maxima_is_bit_identical_to_a_run_recorded_without(
    session, monkeypatch
):
    request = _forget(session)
    new = session.run(make_method("fedrecover", PARAMS), request)
    # a run recorded before the statistic existed: no record carries it
    monkeypatch.setattr(fedrecover, "MAX_ABS_KEY", "absent in every record")
    old = session.run(make_method("fedrecover", PARAMS), request)
    assert new.params.numpy().tobytes() == old.params.numpy().tobytes()
    assert new.details == old.details
    # tau depends on every update of its pool, read or not: the lineage names them all
    assert new.lineage is not None
    assert new.lineage.to_dict() == old.lineage.to_dict()
    assert new.details.estimated_updates > 0
    assert math.isfinite(new.details.tau)
    assert new.costs.client_epochs == old.costs.client_epochs
    # tau's pass read at most 2 updates a round instead of every remaining participant's
    participants, _ = make_method("fedrecover", PARAMS)._participants(session.context(request))
    pool = sum(len(ids) for ids in participants.values())
    p = session.run_view.final_params.numel()
    saved = old.costs.history_bytes_read - new.costs.history_bytes_read
    assert saved >= (pool - 2 * ROUNDS) * p * 4 > 0


@pytest.mark.parametrize("k", [1, 2, 3, 5, 17, 40])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pruned_kth_largest_equals_the_streamed_one_with_ties(k, seed):
    g = torch.Generator().manual_seed(seed)
    updates = {c: torch.randint(-6, 7, (20,), generator=g).float() / 4 for c in range(8)}
    maxima = {c: float(u.abs().max()) for c, u in updates.items()}
    reads: list[int] = []

    def read(cid: int) -> torch.Tensor:
        reads.append(cid)
        return updates[cid]

    got = _kth_largest_abs_of(read, maxima, k)
    assert got == kth_largest_abs(iter(updates.values()), k, 160)
    assert len(reads) == len(set(reads))  # each update read at most once
    # the updates read are the ones with the largest maxima, in that order
    order = sorted(maxima, key=lambda c: (-maxima[c], c))
    assert reads == order[: len(reads)]
    if k == 1:
        assert len(reads) == 1
