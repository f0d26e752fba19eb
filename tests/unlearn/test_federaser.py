import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedunlearn.errors import UnsupportedHistoryError
from fedunlearn.fl.aggregators import fedavg
from fedunlearn.fl.clients import TrainTask
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method
from fedunlearn.unlearn.replay import calibrate


def test_forget_nobody_without_shortcut_reconstructs_the_original_model(run_all):
    """Δt = 1, r = 1: calibration restarts from the original trajectory, so U~ = U."""
    method = make_method("federaser", {"interval": 1, "calibration_ratio": 1.0})
    with UnlearnSession(run_all, evaluate=False) as session:
        request = UnlearnRequest.of([])
        params = method._run(request, session.context(request)).params
        final = session.run_view.final_params
    assert float((params - final).norm()) <= 1e-5 * float(final.norm())


def test_federaser_equals_a_plain_calibrated_replay_loop(run_all):
    method = make_method("federaser", {"interval": 1, "calibration_ratio": 1.0})
    with UnlearnSession(run_all, evaluate=False) as session:
        request = UnlearnRequest.of([3])
        result = session.run(method, request)
        # reference: the algorithm written out with the raw federation and store
        fed, store = session.federation, session.run_view.store
        keep = [c for c in fed.client_ids if c != 3]
        w = store.read_model(0)
        for t in range(1, 6):
            if t == 1:
                steps = [store.read_update(1, c) for c in keep]
            else:
                fresh = fed.train(TrainTask(w, keep, t))
                steps = [
                    u.delta * (store.read_update(t, u.client_id).norm() / u.delta.norm())
                    for u in fresh
                ]
            sizes = torch.tensor([float(fed.num_samples(c)) for c in keep])
            w = w + fedavg(torch.stack(steps), sizes)
    assert torch.allclose(result.params, w, atol=1e-6)


def test_cost_accounting_and_retained_rounds(run_all, run_every2):
    with UnlearnSession(run_all, evaluate=False) as session:
        result = session.run(make_method("federaser", {"interval": 2}), UnlearnRequest.of([0]))
    # rounds 1, 3, 5 retained; the first uncalibrated; E_cali = ceil(0.5 * 2) = 1
    assert result.details.retained_rounds == (1, 3, 5)
    assert result.costs.client_epochs == 4 * (3 - 1) * math.ceil(0.5 * 2)
    assert result.costs.rounds == 3
    with UnlearnSession(run_every2, evaluate=False) as session:
        ok = session.run(make_method("federaser"), UnlearnRequest.of([0]))
        assert ok.details.retained_rounds == (1, 3, 5)
        with pytest.raises(UnsupportedHistoryError, match="kept every 2th round"):
            session.run(make_method("federaser", {"interval": 3}), UnlearnRequest.of([0]))


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from(["model", "layer"]))
def test_calibration_keeps_stored_norm_and_fresh_direction(seed, scope):
    g = torch.Generator().manual_seed(seed)
    sizes = (7, 3, 5)
    stored, fresh = (
        torch.randn(15, generator=g, dtype=torch.float64),
        torch.randn(15, generator=g, dtype=torch.float64),
    )
    out = calibrate(stored, fresh, scope, sizes)
    parts = (
        zip(out.split(sizes), stored.split(sizes), fresh.split(sizes), strict=True)
        if scope == "layer"
        else [(out, stored, fresh)]
    )
    for o, s, f in parts:
        assert torch.isclose(o.norm(), s.norm())
        assert torch.isclose(
            torch.dot(o, f) / (o.norm() * f.norm()), torch.tensor(1.0, dtype=torch.float64)
        )


def test_vanishing_fresh_update_calibrates_to_zero():
    assert torch.equal(calibrate(torch.ones(4), torch.zeros(4)), torch.zeros(4))
