"""Crab's options: what training records (``history.crab``) and how recovery runs (``CrabParams``).

Paper: Jiang, Shen, Liu, Tan, Lam, "Towards Efficient and Certified Recovery from Poisoning
Attacks in Federated Learning", arXiv:2401.08216v2, Alg. 1-2. Every default that differs from
the paper carries its tag ([Dn]) from docs/methods/crab.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal, cast

from pydantic import BaseModel, ConfigDict, Field

from fedunlearn.unlearn.base import MethodParams

if TYPE_CHECKING:
    from fedunlearn.config import HistoryConfig

__all__ = ["CrabParams", "CrabSelectionConfig", "crab_options"]


class CrabSelectionConfig(BaseModel):
    """Crab's selective storage (Sec. IV-B1, Alg. 1, Eqs. 1-2): windows, rounds and clients.

    The YAML section ``history.crab``. Used live by ``history.policy: crab`` and by the
    ``crab`` method when it derives the selection from a run recorded with ``all`` (both give
    the identical selection).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    alpha: float = Field(0.1, gt=0, lt=1, description="α: a window closes at a loss drop of α")
    round_ratio: float = Field(0.6, gt=0, le=1, description="λ: share of a window's rounds kept")
    client_ratio: float = Field(0.7, gt=0, le=1, description="δ: share of a round's clients kept")
    divergence: Literal["pred_kl", "param_softmax_kl"] = Field(
        "pred_kl", description="round score: KL of predictions on R, or the code's param proxy"
    )
    rounding: Literal["half_up", "floor"] = Field(
        "half_up", description="P_b = max(1, round_half_up(λ B_b)) [CB4], or floor (the code)"
    )
    reference_size: int = Field(
        2000, ge=1, description="|R|: seeded clean subsample of the clients' training data [CB2]"
    )
    max_window: int | None = Field(
        None, ge=1, description="close a window after this many rounds [CB5]; None = never"
    )


class CrabParams(MethodParams):
    """Crab hyperparameters (selection overrides apply only to runs recorded with ``all``).

    ``rollback`` picks Stage II's rule (``crab.rollback``: participation [CB10], bounded [CB11],
    paper); ``beta``, ``rule`` and ``influence_weights`` apply to the S-based rules (bounded,
    paper). ``final_rounds`` adds FedAvg rounds of the remaining clients after the replay
    [CB13]; ``auto`` runs as many as the replay skipped after the rollback point, within
    ``epoch_budget`` times Retrain's client epochs.
    """

    rollback: Literal["participation", "bounded", "paper"] = Field(
        "participation", description="Stage II rule: exact participation, bounded S, or Eq. 4-6"
    )
    beta: float = Field(0.3, gt=0, description="β: sensitivity threshold ratio (Eq. 5)")
    rule: Literal["literal", "prefix"] = Field(
        "prefix", description="j* rule of the S-based rollbacks: prefix [CB12] or literal (Eq. 6)"
    )
    influence_weights: Literal["benign", "all"] = Field(
        "benign", description="normalise I(K^-) by n_{K^-} (paper) or n_K [CB7]"
    )
    no_rollback: bool = Field(False, description="ablation: j* = 0 (replay from M_0)")
    norm_scope: Literal["model", "layer"] = "model"
    final_rounds: Annotated[int, Field(ge=0, le=100_000)] | Literal["auto"] = Field(
        "auto", description="FedAvg rounds after the replay [CB13]: a count, or auto"
    )
    epoch_budget: float = Field(
        0.6, gt=0, le=1, description="auto final rounds: total client epochs <= this x Retrain's"
    )
    alpha: float | None = Field(None, gt=0, lt=1, description="override history.crab.alpha")
    round_ratio: float | None = Field(None, gt=0, le=1, description="override λ")
    client_ratio: float | None = Field(None, gt=0, le=1, description="override δ")
    bound_check: bool = Field(False, description="retrain from Mtilde_0 and report the bounds")


def crab_options(history: HistoryConfig) -> CrabSelectionConfig:
    """Return the run's ``history.crab`` options, typed (validated as this by its PolicySpec)."""
    return cast(CrabSelectionConfig, history.options("crab", CrabSelectionConfig))
