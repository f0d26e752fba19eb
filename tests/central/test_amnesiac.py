"""Amnesiac unit checks (baselines spec §5.7)."""

from __future__ import annotations

import torch
from central_problems import blobs

from fedunlearn.central import SGDSpec, SoftmaxRegression, make_method, replay_retrain, train_sgd


def run(n=100, batch=16, passes=1):
    x, y = blobs(n=n, d=4)
    objective = SoftmaxRegression(x, y, 3, 0.005)
    return objective, train_sgd(objective, SGDSpec(lr=0.1, batch_size=batch, passes=passes))


def test_untouched_batches_leave_the_model_bitwise_unchanged():
    objective, record = run()  # 100 samples, B = 16: 4 samples never drawn in the one pass
    unused = torch.tensor(sorted(set(range(100)) - set(record.batches.flatten().tolist())))
    assert len(unused) == 4
    result = make_method("amnesiac").unlearn(objective, record, unused)
    assert torch.equal(result.params, record.final)
    assert result.details["batches_reverted"] == 0


def test_reverting_every_batch_gives_the_initial_model():
    objective, record = run(passes=3)
    result = make_method("amnesiac").unlearn(objective, record, torch.arange(100))
    assert float((result.params - record.iterate(0)).abs().max()) <= 1e-12


def test_last_batch_only_equals_replay():
    objective, record = run()
    last = record.batch(record.num_steps)
    result = make_method("amnesiac").unlearn(objective, record, last)
    reference, _ = replay_retrain(objective, record, last)
    assert torch.allclose(result.params, reference, rtol=0, atol=1e-15)
    assert torch.allclose(reference, record.iterate(record.num_steps - 1), rtol=0, atol=0)


def test_storage_accounting_and_repair():
    objective, record = run(passes=2)
    result = make_method("amnesiac").unlearn(objective, record, torch.tensor([3]))
    steps, p = record.num_steps, objective.num_params
    assert result.stored_bytes == steps * p * 8 + steps * 16 * 8
    repaired = make_method("amnesiac", dict(repair_passes=1)).unlearn(
        objective, record, torch.tensor([3])
    )
    assert not torch.equal(repaired.params, result.params)
