"""The per-round budget ε_t of DP training: schedules by name, each with its options model.

A budget schedule is a training hook that a plugin provides (``fedunlearn.plugins``):
``privacy.budget.schedule`` names a ``BudgetScheduleSpec`` in ``BUDGET_SCHEDULES``, which
carries the pydantic model of the schedule's options (a subclass of
``fedunlearn.config.BudgetConfig``) and builds the schedule from the validated section. FedADP's
Eq. 4 is the ``fedadp`` plugin's. ``resolve_budget`` validates ``privacy.budget`` by the named
schedule's model where a run is assembled (``fedunlearn.runs.resolve_config``), as
``fedunlearn.history.policy.resolve_history`` validates a recording policy's options.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from fedunlearn.config import BudgetConfig
from fedunlearn.errors import ConfigError, UnknownNameError
from fedunlearn.registry import Registry

__all__ = [
    "BUDGET_SCHEDULES",
    "BudgetScheduleSpec",
    "EpsilonSchedule",
    "budget_schedule",
    "epsilon_bounds",
    "resolve_budget",
]


class EpsilonSchedule(Protocol):
    """The per-round budget ε_t of DP training, fed the server loss after each round."""

    def epsilon(self, round_: int) -> float:
        """Return ε of ``round_`` (1-based)."""
        ...

    def observe(self, round_: int, loss: float) -> None:
        """Record L(M_round), the loss after ``round_`` (round 0: the initial model)."""
        ...

    def reset(self, losses: Sequence[float], start: int = 0) -> None:
        """Rebuild the state from the losses of rounds start..last (``--resume``, ``--continue``).

        ``start`` > 0: the schedule restarts after round ``start`` (its first loss is
        L(M_start) and round start + 1 runs at the initial budget).
        """
        ...


@dataclass(frozen=True)
class BudgetScheduleSpec:
    """A budget schedule by name (a plugin's training hook).

    Attributes:
        name: The YAML ``privacy.budget.schedule`` value.
        build: ``budget -> schedule`` from the run's validated ``privacy.budget`` section (an
            instance of ``options_type``).
        options_type: The model of the section's options: a subclass of ``BudgetConfig``
            that forbids unknown keys and answers ``epsilon_bounds``.
    """

    name: str
    build: Callable[[Any], EpsilonSchedule]
    options_type: type[BudgetConfig]


BUDGET_SCHEDULES: Registry[BudgetScheduleSpec] = Registry(
    "budget schedule", UnknownNameError, plugin_kind="budget_schedules"
)


def _spec(budget: BudgetConfig) -> BudgetScheduleSpec:
    try:
        return BUDGET_SCHEDULES.get(budget.schedule)
    except UnknownNameError as err:
        raise UnknownNameError(f"privacy.budget.schedule: {err}") from None


def _errors(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        where = ".".join(["privacy", "budget", *(str(p) for p in e["loc"])])
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r})"
        parts.append(msg if msg.startswith(f"{where}.") else f"{where}: {msg}{shown}")
    return "; ".join(parts)


def resolve_budget(budget: BudgetConfig) -> BudgetConfig:
    """Return ``budget`` validated by its schedule's options model (every option filled in).

    A resolved section resolves to itself.

    Raises:
        UnknownNameError: No installed plugin provides the schedule (lists those that do).
        ConfigError: An option is unknown or invalid (one line naming
            ``privacy.budget.<option>``, the value and what is allowed).
    """
    spec = _spec(budget)
    if isinstance(budget, spec.options_type):
        return budget
    try:
        return spec.options_type.model_validate(budget.model_dump())
    except ValidationError as err:
        raise ConfigError(f"invalid configuration: {_errors(err)}") from None


def budget_schedule(budget: BudgetConfig) -> EpsilonSchedule:
    """Return the schedule ``budget.schedule`` built from ``budget`` (validated first).

    Raises:
        UnknownNameError: No installed plugin provides that schedule (lists those that do).
        ConfigError: The section does not validate against the schedule's options model.
    """
    return _spec(budget).build(resolve_budget(budget))


def epsilon_bounds(budget: BudgetConfig) -> tuple[float, float]:
    """Return the smallest and the largest ε_t the section's schedule can give."""
    return resolve_budget(budget).epsilon_bounds()
