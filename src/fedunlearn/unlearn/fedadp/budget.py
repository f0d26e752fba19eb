"""FedADP's training hook: the adaptive budget schedule ``privacy.budget.schedule: fedadp``.

The ``fedadp`` plugin declares ``BUDGET_SCHEDULE``; DP training
(``fedunlearn.privacy.training.PrivateTraining``) builds it from the run's ``privacy.budget``
section without naming FedADP. The Eq. 4 arithmetic is ``fedunlearn.privacy.schedule``.

Paper: Jiang et al., FedADP, Sec. IV-B1, Eq. 4 and Alg. 1 lines 25-26 (docs/methods/fedadp.md,
AD3-AD5).
"""

from __future__ import annotations

from fedunlearn.config import BudgetConfig
from fedunlearn.privacy.schedule import BudgetSchedule
from fedunlearn.privacy.training import BudgetScheduleSpec

__all__ = ["BUDGET_SCHEDULE", "fedadp_schedule"]


def fedadp_schedule(budget: BudgetConfig) -> BudgetSchedule:
    """Return Eq. 4's schedule: ε_1 = ε_0, then ε grows with the server loss change."""
    return BudgetSchedule(
        budget.epsilon_initial, budget.epsilon_min, budget.epsilon_max, budget.signed_delta
    )


BUDGET_SCHEDULE = BudgetScheduleSpec("fedadp", fedadp_schedule)
