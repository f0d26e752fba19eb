"""FedADP's training hook: the adaptive budget schedule ``privacy.budget.schedule: fedadp``.

The ``fedadp`` plugin declares ``BUDGET_SCHEDULE``: the schedule and the model of its options
(``FedADPBudget``, the YAML section ``privacy.budget``), which the core validates where a run is
assembled (``fedunlearn.privacy.budget.resolve_budget``) without naming FedADP. DP training
(``fedunlearn.privacy.training.PrivateTraining``) builds the schedule from the validated
section. The Eq. 4 arithmetic is ``fedunlearn.privacy.schedule``.

Paper: Jiang et al., FedADP, Sec. IV-B1, Eq. 4 and Alg. 1 lines 25-26 (docs/methods/fedadp.md,
AD3-AD5).
"""

from __future__ import annotations

from pydantic import ConfigDict, Field, model_validator

from fedunlearn.config import BudgetConfig
from fedunlearn.privacy.schedule import BudgetSchedule
from fedunlearn.privacy.training import BudgetScheduleSpec

__all__ = ["BUDGET_SCHEDULE", "FedADPBudget", "fedadp_schedule"]


class FedADPBudget(BudgetConfig):
    """FedADP's adaptive budget options (``privacy.budget`` of ``schedule: fedadp``; Eq. 4).

    ε_1 = ε_0 and ε_{t+1} = min(max(ε_t · e^{|Δloss|}, ε_min), ε_max). Its options are
    FedADP's, not the privacy layer's (docs/methods/fedadp.md, AD4-AD5).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    epsilon_initial: float = Field(1.0, gt=0, le=1000, description="ε_0")
    epsilon_min: float = Field(1.0, gt=0, le=1000, description="ε_min")
    epsilon_max: float = Field(3.0, gt=0, le=1000, description="ε_max")
    signed_delta: bool = Field(False, description="Eq. 4 with the signed loss change")

    @model_validator(mode="after")
    def _bounds(self) -> FedADPBudget:
        if self.epsilon_min > self.epsilon_max:
            raise ValueError(
                f"privacy.budget.epsilon_min ({self.epsilon_min}) must not exceed "
                f"privacy.budget.epsilon_max ({self.epsilon_max})"
            )
        return self

    def epsilon_bounds(self) -> tuple[float, float]:
        """Return (ε_min, ε_max): Eq. 4 clamps every round's ε_t to them."""
        return self.epsilon_min, self.epsilon_max


def fedadp_schedule(budget: FedADPBudget) -> BudgetSchedule:
    """Return Eq. 4's schedule: ε_1 = ε_0, then ε grows with the server loss change."""
    return BudgetSchedule(
        budget.epsilon_initial, budget.epsilon_min, budget.epsilon_max, budget.signed_delta
    )


BUDGET_SCHEDULE = BudgetScheduleSpec("fedadp", fedadp_schedule, FedADPBudget)
