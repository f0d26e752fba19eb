"""The contract of a centralised unlearning method: ``CentralUnlearner`` and ``CentralResult``.

A method is built from validated hyper-parameters (a frozen pydantic ``params_type``), never
from data, and ``unlearn(objective, record, forget)`` maps the SGD run (``TrainingRecord``) and a
forget set ``D_U`` (sample indices) to new parameters, timing only the unlearning work. Forgetting
nobody returns the method's original model unchanged. Methods needing history the record lacks
raise ``UnsupportedHistoryError`` before any work.

Paper: Huang et al., "Machine Unlearning with Minimal Gradient Dependence for High Unlearning
Ratios", §5.1 (the methods compared). Deviations: none; the shape follows ``unlearn.base`` (a
frozen hyper-parameter model, the same checks before any work) for centralised sample removal.
Design notes: docs/methods/central_baselines.md.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from fedunlearn.central.objectives import Objective
from fedunlearn.central.trainer import TrainingRecord
from fedunlearn.errors import ConfigError

__all__ = ["CentralResult", "CentralUnlearner", "NoParams", "Outcome"]


class NoParams(BaseModel):
    """Hyper-parameters of a method that has none."""

    model_config = ConfigDict(frozen=True, extra="forbid")


@dataclass(frozen=True)
class Outcome:
    """What a method's ``_unlearn`` returns (the base adds the name and timing).

    Attributes:
        params: Unlearned flat parameters (float64, ``nn.Linear`` layout).
        stored_bytes: Bytes of training-time history the method needs (peak stored).
        gradient_evals: Per-sample gradient or Hessian-vector evaluations spent.
        details: Method-specific facts (guard counts, k, bounds).
    """

    params: torch.Tensor
    stored_bytes: int
    gradient_evals: int = 0
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class CentralResult:
    """One unlearning call.

    Attributes:
        method: Registry name.
        params: Unlearned flat parameters (float64).
        wall_seconds: Wall time of the unlearning work (preparation excluded).
        stored_bytes: Peak history bytes the method relies on.
        gradient_evals: Per-sample gradient / HVP evaluations.
        details: Method-specific facts.
    """

    method: str
    params: torch.Tensor
    wall_seconds: float
    stored_bytes: int
    gradient_evals: int
    details: dict[str, Any]


class CentralUnlearner(ABC):
    """Base class; subclasses set ``name`` and ``params_type`` and implement ``_unlearn``.

    Args:
        params: Hyper-parameters: a ``params_type`` instance or a dict of its fields.

    Raises:
        ConfigError: on an unknown or out-of-range hyper-parameter.
    """

    name: ClassVar[str] = ""
    params_type: ClassVar[type[BaseModel]] = NoParams

    def __init__(self, params: BaseModel | Mapping[str, Any] | None = None) -> None:
        try:
            self.params: Any = (
                params
                if isinstance(params, self.params_type)
                else self.params_type.model_validate(dict(params or {}))
            )
        except ValidationError as err:
            raise ConfigError(
                f"invalid parameters for central method '{self.name}': {err}"
            ) from None

    def prepare(self, objective: Objective, record: TrainingRecord) -> None:  # noqa: B027
        """Do untimed set-up (e.g. Certified Removal's own training); default nothing."""

    def original(self, objective: Objective, record: TrainingRecord) -> torch.Tensor:
        """Return the model this method starts from (``w_T`` unless overridden)."""
        return record.final

    def unlearn(
        self, objective: Objective, record: TrainingRecord, forget: torch.Tensor
    ) -> CentralResult:
        """Remove the samples ``forget`` (indices into the training set).

        Args:
            objective: The training objective (holds the data).
            record: The recorded SGD run.
            forget: Indices of ``D_U``.

        Returns:
            The result, with the wall time of the unlearning step alone.
        """
        forget = torch.unique(torch.as_tensor(forget, dtype=torch.int64))
        self.check(record)
        self.prepare(objective, record)
        start = time.perf_counter()
        if len(forget) == 0:
            outcome = Outcome(self.original(objective, record).clone(), 0, 0, {"short_circuit": 1})
        else:
            outcome = self._unlearn(objective, record, forget)
        wall = time.perf_counter() - start
        return CentralResult(
            self.name,
            outcome.params,
            wall,
            outcome.stored_bytes,
            outcome.gradient_evals,
            outcome.details,
        )

    def check(self, record: TrainingRecord) -> None:  # noqa: B027
        """Raise ``UnsupportedHistoryError`` if the record lacks what the method needs."""

    @abstractmethod
    def _unlearn(
        self, objective: Objective, record: TrainingRecord, forget: torch.Tensor
    ) -> Outcome: ...
