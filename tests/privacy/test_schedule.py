"""The adaptive budget of Eq. 4 (FedADP Sec. IV-B1; AD5 in docs/methods/fedadp.md)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedunlearn.errors import ConfigError
from fedunlearn.privacy.schedule import BudgetSchedule, epsilon_sequence, next_epsilon


def test_scheduler_gives_the_spec_sequence():
    # Delta_loss = [1.0, 0.3, 0.1], eps_0 = 1, eps_max = 3: [1.0 -> 2.718 -> 3.0 -> 3.0]
    losses = [2.0, 1.0, 0.7, 0.6]
    seq = epsilon_sequence(losses, 1.0, 1.0, 3.0)
    assert seq == pytest.approx([1.0, math.e, 3.0, 3.0])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0, 20), min_size=1, max_size=30),
    st.floats(0.1, 5),
    st.floats(0.1, 2),
    st.floats(0, 5),
    st.booleans(),
)
def test_budget_stays_in_bounds_and_absolute_mode_never_decreases(
    losses, eps0, eps_min, width, signed
):
    eps_max = eps_min + width
    seq = epsilon_sequence(losses, eps0, eps_min, eps_max, signed_delta=signed)
    assert len(seq) == len(losses)
    assert all(eps_min <= e <= eps_max for e in seq)
    if not signed:
        assert all(b >= a for a, b in zip(seq, seq[1:], strict=False))


def test_signed_delta_lowers_the_budget_when_the_loss_rises():
    assert next_epsilon(2.0, 1.0, 1.5, 1.0, 3.0, signed_delta=True) == pytest.approx(
        2.0 * math.exp(-0.5)
    )
    assert next_epsilon(2.0, 1.0, 1.5, 1.0, 3.0) == 3.0  # |change| = 0.5 -> 3.30 clamps to 3


def test_schedule_state_follows_observed_losses_and_rebuilds_on_resume():
    sched = BudgetSchedule(1.0, 1.0, 3.0)
    for r, loss in enumerate([2.3, 2.1, 1.0]):
        sched.observe(r, loss)
    assert sched.epsilon(1) == 1.0
    assert sched.epsilon(2) == pytest.approx(math.exp(0.2))
    assert sched.epsilon(3) == 3.0
    other = BudgetSchedule(1.0, 1.0, 3.0)
    other.reset([2.3, 2.1, 1.0])
    assert other.epsilon(3) == sched.epsilon(3)
    with pytest.raises(ConfigError, match="expects the loss of round 3; got round 5"):
        sched.observe(5, 0.5)
    with pytest.raises(ConfigError, match="epsilon of round 4 needs the losses"):
        sched.epsilon(4)
    with pytest.raises(ConfigError, match="epsilon_min <= epsilon_max"):
        BudgetSchedule(1.0, 3.0, 2.0)
