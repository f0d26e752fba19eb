"""FedADP's options: what training records (``history.fedadp``) and how unlearning runs.

Paper: Jiang, Tong, Liu, Ye, Tan, Lam, "Efficient Federated Unlearning with Adaptive Differential
Privacy Preservation", Alg. 1-2. Design notes and every deviation: docs/methods/fedadp.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fedunlearn.unlearn.base import MethodParams

__all__ = ["FedADPParams", "FedADPSelectionConfig"]


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
    """FedADP unlearning hyperparameters (selection overrides apply only to ``all`` runs)."""

    clamp_negative_cos: bool = Field(False, description="U = 0 when cos θ < 0 (AD11)")
    unlearn_dp: bool = Field(False, description="clip and noise the fresh updates (AD9)")
    local_epochs: int | None = Field(
        None, ge=1, le=1000, description="local epochs of the fresh updates; default: the run's E"
    )
    init: Literal["initial", "first_selected"] = Field(
        "initial", description="start from M_0 (AD8) or the first stored round's model"
    )
    calibration: Literal["projection", "fresh", "norm"] = Field(
        "projection", description="Eq. 11 (projection); ablations: fresh ĝ, FedEraser norm"
    )
    beta: float | None = Field(None, gt=0, lt=1, description="override history.fedadp.beta")
    round_ratio: float | None = Field(None, gt=0, le=1, description="override λ")
    client_ratio: float | None = Field(None, gt=0, le=1, description="override γ")
