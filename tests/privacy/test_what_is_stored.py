"""What a DP run uploads and stores about each client, and what ``forget`` leaves (issue 40, 1).

Before issue 40 every DP upload carried the client's noise-free mean training loss, the store
kept it per client and round (round 1 of the digits example: 1.76 and 1.68 for the two
backdoored clients against 2.18-2.38 for the honest ones), and ``forget`` left it, with the
client's norm and <Δ_c, G_t>, in the forgotten client's rows.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from fedunlearn.fl.aggregators import fedavg
from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.engine import mean_train_loss
from fedunlearn.fl.records import ClientData, ClientUpdate, RoundRecord
from fedunlearn.history import HistoryStore, RoundEntry
from fedunlearn.history.policy import DOT_AGGREGATE_KEY, HistoryRecorder, RecordAll
from fedunlearn.history.store import ClientRecord
from fedunlearn.models import build_model
from fedunlearn.privacy.local_training import DPSGDTraining
from fedunlearn.privacy.uploads import ClipAndNoise

SPEC = LocalTrainingSpec(epochs=2, lr=0.2, batch_size=8)


def make_clients(sizes: list[int]) -> dict[int, ClientData]:
    g = torch.Generator().manual_seed(0)
    return {
        c: ClientData(
            torch.rand((n, 1, 8, 8), generator=g), torch.randint(0, 10, (n,), generator=g)
        )
        for c, n in enumerate(sizes)
    }


def _mlp():
    return build_model("mlp", (1, 8, 8), 10, seed=0, hidden=(12,))


def test_a_dp_sgd_client_uploads_no_training_loss():
    model = _mlp()
    clients = make_clients([30, 45, 9])
    training = DPSGDTraining(model, clients, clip_norm=0.5, delta=1e-5, epsilon_of=lambda r: 3.0)
    start = torch.zeros(sum(p.numel() for p in model.parameters()))
    updates = training.run(start, [(c, 100 + c) for c in clients], SPEC, 1)
    assert [math.isnan(u.train_loss) for u in updates] == [True] * 3
    assert all(u.num_samples == len(clients[u.client_id]) for u in updates)
    # the round metric leaves out the clients that report no loss: none here
    assert mean_train_loss(updates) == {}


@pytest.mark.parametrize("perturb", [True, False], ids=["train_and_store", "store_only"])
def test_clip_and_noise_uploads_no_training_loss(perturb):
    mod = ClipAndNoise(
        clip_norm=1.0,
        delta=1e-5,
        noise_mode="standard",
        seed=3,
        epsilon_of=lambda r: 3.0,
        perturb=perturb,
    )
    ups = [ClientUpdate(c, torch.full((50,), float(c + 1)), 10, 1.5 + c) for c in range(3)]
    out = mod(1, torch.zeros(50), ups)
    assert [math.isnan(u.train_loss) for u in out] == [True] * 3
    assert all(torch.equal(a.delta, b.delta) != perturb for a, b in zip(out, ups, strict=True))


def test_the_round_loss_is_the_mean_over_the_clients_that_report_one():
    ups = [
        ClientUpdate(0, torch.zeros(2), 10, 1.0),
        ClientUpdate(1, torch.zeros(2), 30, 3.0),
        ClientUpdate(2, torch.zeros(2), 60, float("nan")),
    ]
    assert mean_train_loss(ups) == {"train_loss": pytest.approx(2.5)}


def _record(losses: list[float]) -> RoundRecord:
    g = torch.Generator().manual_seed(0)
    deltas = [torch.randn(20, generator=g) for _ in losses]
    sizes = [10] * len(losses)
    aggregate = fedavg(torch.stack(deltas), torch.tensor(sizes, dtype=torch.float32))
    return RoundRecord(
        round=1,
        global_before=torch.zeros(20),
        global_after=aggregate,
        aggregate=aggregate,
        updates=tuple(ClientUpdate(c, deltas[c], sizes[c], loss) for c, loss in enumerate(losses)),
    )


def test_the_store_keeps_no_loss_a_client_did_not_report(tmp_path):
    with HistoryStore.create(tmp_path / "h", {}) as store:
        store.write_round(RoundEntry(round=0, global_model=torch.zeros(20)))
        HistoryRecorder(store, RecordAll()).on_round_end(_record([float("nan"), 2.0]))
        records = {r.client_id: r for r in store.client_records(1)}
    assert records[0].loss is None  # before: the text 'nan', or the client's clean loss
    assert records[1].loss == 2.0
    assert records[0].norm is not None
    assert DOT_AGGREGATE_KEY in records[0].scalars


def test_a_store_only_recorder_keeps_no_norm_nor_inner_product(tmp_path):
    with HistoryStore.create(tmp_path / "h", {}) as store:
        store.write_round(RoundEntry(round=0, global_model=torch.zeros(20)))
        recorder = HistoryRecorder(store, RecordAll(), client_values=False)
        recorder.on_round_end(_record([float("nan"), float("nan")]))
        records = store.client_records(1)
    assert [(r.norm, r.loss, DOT_AGGREGATE_KEY in r.scalars) for r in records] == [
        (None, None, False)
    ] * 2


def test_forget_drops_every_value_of_the_forgotten_clients(tmp_path):
    # Prepare: client 1 stored in round 1, recorded without its update in round 2
    d = torch.arange(8, dtype=torch.float32)
    with HistoryStore.create(tmp_path / "h", {}) as store:
        store.write_round(RoundEntry(round=0, global_model=torch.zeros(8)))
        for r, stored in ((1, {0: d, 1: d}), (2, {0: d})):
            store.write_round(
                RoundEntry(
                    round=r,
                    global_model=d * r,
                    aggregate=d,
                    updates=stored,
                    clients=[
                        ClientRecord(
                            c,
                            "accepted",
                            10 + c,
                            norm=1.0 + c,
                            loss=2.0 + c,
                            scalars={DOT_AGGREGATE_KEY: 3.0 + c, "multiplicity": 2},
                        )
                        for c in (0, 1)
                    ],
                )
            )
        # Execute
        store.forget([1])
        rows = {(r, c.client_id): c for r in (1, 2) for c in store.client_records(r)}
    # Assert: every value of client 1 is gone from both rounds; who took part stays
    for r in (1, 2):
        gone = rows[(r, 1)]
        assert (gone.norm, gone.loss, gone.scalars) == (None, None, {"multiplicity": 2})
        assert (gone.status, gone.num_samples) == ("accepted", 11)
        kept = rows[(r, 0)]
        assert (kept.norm, kept.loss) == (1.0, 2.0)
        assert kept.scalars == {DOT_AGGREGATE_KEY: 3.0, "multiplicity": 2}
    assert json.dumps(rows[(2, 1)].scalars) == '{"multiplicity": 2}'
