"""HistoryRecorder: what every policy writes of a round (per-client norm and <Δ_c, G_t>)."""

from __future__ import annotations

import pytest
import torch

from fedunlearn.fl.aggregators import fedavg
from fedunlearn.fl.records import ClientUpdate, RejectedUpdate, RoundRecord
from fedunlearn.history import HistoryStore, RoundEntry
from fedunlearn.history.policy import DOT_AGGREGATE_KEY, HistoryRecorder, RecordAll, RecordNone


@pytest.mark.parametrize("policy", [RecordAll(), RecordNone()])
def test_every_client_record_carries_its_norm_and_its_dot_with_the_aggregate(tmp_path, policy):
    # Prepare: one round of three accepted clients and a rejected one
    g = torch.Generator().manual_seed(0)
    deltas = [torch.randn(40, generator=g) for _ in range(3)]
    sizes = [10, 30, 60]
    aggregate = fedavg(torch.stack(deltas), torch.tensor(sizes, dtype=torch.float32))
    record = RoundRecord(
        round=1,
        global_before=torch.zeros(40),
        global_after=aggregate,
        aggregate=aggregate,
        updates=tuple(ClientUpdate(c, deltas[c], sizes[c], 0.5) for c in range(3)),
        rejected=(RejectedUpdate(3, "NaN", 5),),
    )
    with HistoryStore.create(tmp_path / "h", {}) as store:
        store.write_round(RoundEntry(round=0, global_model=torch.zeros(40)))
        # Execute
        HistoryRecorder(store, policy).on_round_end(record)
        records = {r.client_id: r for r in store.client_records(1)}
    # Assert: exact in float64, whatever the policy stored; ||G||^2 = Σ w_c <Δ_c, G> (FedAvg)
    g64 = aggregate.double()
    for c in range(3):
        assert records[c].norm == pytest.approx(float(deltas[c].norm()), rel=1e-6)
        assert records[c].scalars[DOT_AGGREGATE_KEY] == pytest.approx(
            float(deltas[c].double() @ g64), rel=1e-9
        )
    weighted = sum(sizes[c] / 100 * records[c].scalars[DOT_AGGREGATE_KEY] for c in range(3))
    assert weighted == pytest.approx(float(g64 @ g64), rel=1e-5)
    assert records[3].status == "rejected"
    assert DOT_AGGREGATE_KEY not in records[3].scalars
