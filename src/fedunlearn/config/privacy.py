"""The ``privacy`` section: DP of training (the mechanism) and its per-round budget ε_t."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, model_validator

from fedunlearn.config.base import Frozen
from fedunlearn.config.migrate import migrate_privacy
from fedunlearn.errors import ConfigError


class BudgetConfig(BaseModel):
    """The per-round budget ε_t of DP training (the YAML section ``privacy.budget``).

    ``schedule`` names a budget schedule that an installed plugin declares
    (``fedunlearn.privacy.budget.BUDGET_SCHEDULES``; FedADP's Eq. 4 is the ``fedadp`` plugin's
    ``fedadp``, the default). The schedule's options belong to the plugin: its
    ``BudgetScheduleSpec`` names their model, a subclass of this one, and the section is
    validated by it where the run is assembled (``fedunlearn.runs.resolve_config``), as a
    recording policy's options are. Until then the options are kept as given. The same keys
    given flat in ``privacy`` (the pre-issue-13 layout) are moved here (``config.migrate``).
    """

    model_config = ConfigDict(frozen=True, extra="allow", allow_inf_nan=False)

    schedule: str = Field(
        "fedadp",
        description="budget schedule by name; fedadp: FedADP's Eq. 4 (ε follows the loss change)",
    )

    def epsilon_bounds(self) -> tuple[float, float]:
        """Return the smallest and the largest ε_t the schedule can give.

        Raises:
            ConfigError: The section has not been validated by its schedule's options model
                (``fedunlearn.privacy.budget.resolve_budget``; ``fedunlearn.runs`` does it).
        """
        raise ConfigError(
            f"privacy.budget (schedule '{self.schedule}') has not been validated; assemble the "
            "config with fedunlearn.runs.resolve_config before reading the budget"
        )


class PrivacyConfig(Frozen):
    """DP of training: the mechanism, and the per-round budget ε_t a plugin's schedule gives.

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
    budget: SerializeAsAny[BudgetConfig] = Field(
        default_factory=BudgetConfig,
        description="the per-round ε_t schedule by name, and its options",
    )

    @model_validator(mode="before")
    @classmethod
    def _earlier_layout(cls, data: Any) -> Any:
        return migrate_privacy(data)

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
