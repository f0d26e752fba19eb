"""The ``privacy`` section: DP of training (the mechanism) and its per-round budget ε_t."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from fedunlearn.config.base import Frozen

#: The budget options that used to sit flat in ``privacy`` (still accepted there, moved into
#: ``privacy.budget`` on parsing).
BUDGET_KEYS = ("epsilon_initial", "epsilon_min", "epsilon_max", "signed_delta")


def _nest_budget(privacy: dict[str, Any]) -> dict[str, Any]:
    """Return a ``privacy`` mapping with its flat budget keys moved into ``budget``.

    Raises:
        ValueError: a key is given both flat and in ``budget``.
    """
    if not any(k in privacy for k in BUDGET_KEYS):
        return privacy
    data = dict(privacy)
    budget = data.get("budget") or {}
    if isinstance(budget, BaseModel):
        budget = budget.model_dump()
    if not isinstance(budget, dict):
        return data  # the field validator reports the bad type
    budget = dict(budget)
    for key in BUDGET_KEYS:
        if key not in data:
            continue
        if key in budget:
            raise ValueError(
                f"privacy.{key} and privacy.budget.{key} are both given; keep "
                f"privacy.budget.{key} only"
            )
        budget[key] = data.pop(key)
    data["budget"] = budget
    return data


class BudgetConfig(Frozen):
    """The per-round budget ε_t of DP training (the YAML section ``privacy.budget``).

    ``schedule`` names a budget schedule that an installed plugin declares
    (``fedunlearn.privacy.training.BUDGET_SCHEDULES``; checked where the run is assembled).
    ``fedadp`` is FedADP's adaptive budget (Eq. 4): ε_1 = ε_0 and
    ε_{t+1} = min(max(ε_t · e^{|Δloss|}, ε_min), ε_max); it is the only schedule so far, and its
    options are FedADP's, not the privacy layer's (docs/methods/fedadp.md, AD4-AD5). The same
    keys given flat in ``privacy`` (the pre-issue-13 layout) are accepted and moved here.
    """

    schedule: str = Field(
        "fedadp",
        description="budget schedule by name; fedadp: FedADP's Eq. 4 (ε follows the loss change)",
    )
    epsilon_initial: float = Field(1.0, gt=0, le=1000, description="ε_0")
    epsilon_min: float = Field(1.0, gt=0, le=1000, description="ε_min")
    epsilon_max: float = Field(3.0, gt=0, le=1000, description="ε_max")
    signed_delta: bool = Field(False, description="Eq. 4 with the signed loss change")

    @model_validator(mode="after")
    def _bounds(self) -> BudgetConfig:
        if self.epsilon_min > self.epsilon_max:
            raise ValueError(
                f"privacy.budget.epsilon_min ({self.epsilon_min}) must not exceed "
                f"privacy.budget.epsilon_max ({self.epsilon_max})"
            )
        return self


class PrivacyConfig(Frozen):
    """DP of training at FedADP's adaptive per-round budget ε_t (Eq. 4): the mechanism and budget.

    ``mechanism``: ``client_update`` clips each client's whole update to S and adds Gaussian
    noise (Eq. 5-6; client-level; docs/methods/fedadp.md AD1-AD5); ``dp_sgd`` trains each client
    by DP-SGD, per-example clipping to C and Gaussian noise on every batch's sum, the round
    costing ε_t (per-example guarantee; docs/privacy.md).
    """

    enabled: bool = Field(False, description="train with differential privacy")
    mechanism: Literal["client_update", "dp_sgd"] = Field(
        "client_update",
        description="clip+noise each client's update (Eq. 5-6) or DP-SGD in local training",
    )
    clip_norm: float | Literal["auto"] = Field(
        "auto",
        description="S (client_update, parameter-delta units) or C (dp_sgd, per-example "
        "gradient norm), or 'auto' (median norm of a no-DP pilot / of the gradients at M_0)",
    )
    pilot_rounds: int = Field(1, ge=1, le=10, description="no-DP pilot rounds of S='auto'")
    noise_mode: Literal["standard", "paper_literal"] = Field(
        "standard", description="std = S z (standard) or S^2 z (Eq. 5 as printed)"
    )
    dp_scope: Literal["train_and_store", "store_only"] = Field(
        "train_and_store",
        description="noisy uploads drive training (faithful) or only the stored copies are noisy",
    )
    delta: float = Field(1e-5, gt=0, lt=1, description="δ of each release")
    sens_factor: Literal[1, 2] = Field(
        1, description="L2 sensitivity S (add/remove) or 2S (replace) for the headline ε"
    )
    budget: BudgetConfig = Field(
        default_factory=BudgetConfig, description="the per-round ε_t schedule (FedADP Eq. 4)"
    )

    @model_validator(mode="before")
    @classmethod
    def _flat_budget_keys(cls, data: Any) -> Any:
        """Accept ``privacy.epsilon_max`` etc. (the flat layout) as ``privacy.budget.*``."""
        return _nest_budget(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _consistent(self) -> PrivacyConfig:
        if isinstance(self.clip_norm, float) and not 0 < self.clip_norm <= 1e6:
            raise ValueError(
                f"privacy.clip_norm must be in (0, 1e6] or 'auto'; got {self.clip_norm}"
            )
        if self.mechanism == "dp_sgd":
            for name, value, allowed in (
                ("dp_scope", self.dp_scope, "train_and_store"),
                ("noise_mode", self.noise_mode, "standard"),
                ("sens_factor", self.sens_factor, 1),
            ):
                if value != allowed:
                    raise ValueError(
                        f"privacy.{name} {value!r} applies to mechanism 'client_update' only; "
                        f"dp_sgd needs {allowed!r} (per-example add/remove accounting, noise in "
                        "training). Drop the setting or use mechanism 'client_update'."
                    )
        return self
