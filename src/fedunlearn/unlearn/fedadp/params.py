"""FedADP's options: what training records (``history.fedadp``) and how unlearning runs.

Paper: Jiang, Tong, Liu, Ye, Tan, Lam, "Efficient Federated Unlearning with Adaptive Differential
Privacy Preservation", Alg. 1-2. Design notes and every deviation: docs/methods/fedadp.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedunlearn.errors import ConfigError
from fedunlearn.unlearn.base import MethodParams

if TYPE_CHECKING:
    from fedunlearn.config import HistoryConfig

__all__ = ["FedADPParams", "FedADPSelectionConfig", "fedadp_options"]


class FedADPSelectionConfig(BaseModel):
    """FedADP's dual-layer selective storage (Alg. 1, Eqs. 7-9): stages, λ rounds, γ clients.

    The YAML section ``history.fedadp``. Used live by ``history.policy: fedadp`` and by the
    ``fedadp`` method when it derives the selection from a run recorded with ``all``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    beta: float = Field(0.1, gt=0, lt=1, description="β: a stage ends at a loss drop of β")
    round_ratio: float = Field(0.6, gt=0, le=1, description="λ: share of a stage's rounds kept")
    client_ratio: float = Field(0.7, gt=0, le=1, description="γ: share of a round's updates kept")
    model_align: Literal["params", "updates"] = Field(
        "params", description="Eq. 7 on the global models (paper) or on consecutive aggregates"
    )
    selection_mode: Literal["staged", "global"] = Field(
        "staged", description="select per loss stage, or round(λT) rounds over all of training"
    )
    loss_samples: int = Field(
        512, ge=1, le=1_000_000, description="samples per client of the server loss (AD3)"
    )


class FedADPParams(MethodParams):
    """FedADP unlearning hyperparameters (selection overrides apply only to ``all`` runs).

    ``preset: paper`` is Alg. 2 as printed (Eq. 11 on every run, no final tuning); the
    default preset resolves ``calibration: auto`` to the fresh update as it is when the stored
    history is DP-noised (Eq. 11 otherwise, AD24) and ``final_rounds: auto`` to Crab's tuning
    rule within ``epoch_budget`` x Retrain's client epochs on such a history (0 otherwise, AD23).
    """

    preset: Literal["default", "paper"] = Field(
        "default", description="paper: Eq. 11 and no final tuning on every run (AD23, AD24)"
    )
    calibration: Literal["auto", "projection", "fresh", "norm"] = Field(
        "auto",
        description="auto: fresh on a DP-noised history, Eq. 11 (projection) otherwise; "
        "ablations: fresh ĝ, FedEraser norm",
    )
    final_rounds: Annotated[int, Field(ge=0, le=100_000)] | Literal["auto"] = Field(
        "auto", description="FedAvg rounds after the replay (AD23): a count, or auto"
    )
    epoch_budget: float = Field(
        0.5, gt=0, le=1, description="auto final rounds: total client epochs <= this x Retrain's"
    )
    clamp_negative_cos: bool = Field(False, description="U = 0 when cos θ < 0 (AD11)")
    unlearn_dp: bool = Field(
        False,
        description="train the fresh updates under the run's DP mechanism, so the released "
        "model is DP (AD9, AD25): client_update at the stored ε_τ, dp_sgd at unlearn_epsilon",
    )
    unlearn_epsilon: float | None = Field(
        None,
        gt=0,
        le=100,
        description="dp_sgd unlearn_dp: ε per replayed round (default: the run's ε_max)",
    )
    local_epochs: int | None = Field(
        None, ge=1, le=1000, description="local epochs of the fresh updates; default: the run's E"
    )
    init: Literal["initial", "first_selected"] = Field(
        "initial", description="start from M_0 (AD8) or the first stored round's model"
    )
    beta: float | None = Field(None, gt=0, lt=1, description="override history.fedadp.beta")
    round_ratio: float | None = Field(None, gt=0, le=1, description="override λ")
    client_ratio: float | None = Field(None, gt=0, le=1, description="override γ")

    @model_validator(mode="after")
    def _consistent(self) -> FedADPParams:
        if self.unlearn_dp and self.final_rounds not in ("auto", 0):
            raise ConfigError(
                "fedadp with unlearn_dp=true runs no final tuning (its rounds would train "
                f"without noise); got final_rounds={self.final_rounds!r}. Drop final_rounds."
            )
        if self.preset == "paper" and (
            self.calibration not in ("auto", "projection") or self.final_rounds not in ("auto", 0)
        ):
            raise ConfigError(
                "fedadp preset 'paper' is Eq. 11 without final tuning; got calibration="
                f"{self.calibration!r}, final_rounds={self.final_rounds!r}. Drop them or use "
                "preset 'default'."
            )
        return self

    def resolved_calibration(self, dp_history: bool) -> str:
        """Return the calibration ``auto`` stands for: ``fresh`` on a DP-noised history (AD24)."""
        if self.calibration != "auto":
            return self.calibration
        return "fresh" if dp_history and self.preset == "default" else "projection"

    def resolved_final_rounds(self, dp_history: bool) -> int | Literal["auto"]:
        """Return ``final_rounds`` or, for ``auto``, Crab's rule on a DP-noised history (AD23).

        ``auto`` is 0 under ``unlearn_dp``: tuning rounds train without noise.
        """
        if self.final_rounds != "auto":
            return self.final_rounds
        default = dp_history and self.preset == "default" and not self.unlearn_dp
        return "auto" if default else 0


def fedadp_options(history: HistoryConfig) -> FedADPSelectionConfig:
    """Return the run's ``history.fedadp`` options, typed (validated as this by its PolicySpec)."""
    return cast(FedADPSelectionConfig, history.options("fedadp", FedADPSelectionConfig))
