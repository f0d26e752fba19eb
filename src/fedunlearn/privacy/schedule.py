"""The adaptive privacy budget: ε_{t+1} = clip(ε_t · exp(|Δloss|), ε_min, ε_max).

Paper: FedADP (Jiang et al.), Sec. IV-B1, Eq. 4 and Alg. 1 lines 25-26; deviations AD3, AD5
(docs/methods/fedadp.md).

Index convention (toolkit rounds, 1-based): round r runs with ε_r and turns M_{r-1} into M_r;
ε_1 = ε_0 (the configured initial budget) and, after round r,
``ε_{r+1} = min(max(ε_r · exp(Δ_r), ε_min), ε_max)`` with ``Δ_r = |L(M_{r-1}) - L(M_r)|``.

Deviations:
    [REC] ``signed_delta=True`` uses Δ_r = L(M_{r-1}) - L(M_r), so the budget falls when the
        loss rises (AD5); the literal absolute change is the default (ε never decreases).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from fedunlearn.errors import ConfigError


def next_epsilon(
    epsilon: float,
    loss_before: float,
    loss_after: float,
    epsilon_min: float,
    epsilon_max: float,
    *,
    signed_delta: bool = False,
) -> float:
    """Return ε_{t+1} from ε_t and the loss change of round t (Eq. 4)."""
    change = loss_before - loss_after if signed_delta else abs(loss_before - loss_after)
    if not math.isfinite(change):
        raise ConfigError(f"the loss change must be finite; got {loss_before} -> {loss_after}")
    # Eq. 4: eps_{t+1} = min(max(eps_t exp(|loss_{t-1} - loss_t|), eps_min), eps_max)
    grown = epsilon * math.exp(min(change, 700.0))
    return min(max(grown, epsilon_min), epsilon_max)


def epsilon_sequence(
    losses: Sequence[float],
    epsilon_initial: float,
    epsilon_min: float,
    epsilon_max: float,
    *,
    signed_delta: bool = False,
) -> list[float]:
    """Return [ε_1, ..., ε_{n}] for ``losses = [L(M_0), ..., L(M_{n-1})]``.

    ε_1 is the initial budget clamped to [ε_min, ε_max]; each later one follows Eq. 4.
    """
    eps = min(max(epsilon_initial, epsilon_min), epsilon_max)
    out = [eps]
    for before, after in zip(losses[:-1], losses[1:], strict=True):
        eps = next_epsilon(eps, before, after, epsilon_min, epsilon_max, signed_delta=signed_delta)
        out.append(eps)
    return out


@dataclass
class BudgetSchedule:
    """The server's budget state: feed it L(M_0), L(M_1), ...; ask it for ε of a round.

    A schedule may start after round 0 (``reset(losses, start=s)``): its first loss is L(M_s)
    and round s + 1 runs at ε_0. A continuation of a run with forgotten clients restarts it
    there (``fedunlearn.runs.continuation``), so no loss computed on a forgotten client's data
    chooses a later budget.

    Args:
        epsilon_initial: ε_0, the budget of round ``start`` + 1 (clamped to the bounds).
        epsilon_min: ε_min.
        epsilon_max: ε_max.
        signed_delta: Use the signed loss change (AD5 option).
    """

    epsilon_initial: float = 1.0
    epsilon_min: float = 1.0
    epsilon_max: float = 3.0
    signed_delta: bool = False
    losses: list[float] = field(default_factory=list)
    start: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.epsilon_min <= self.epsilon_max:
            raise ConfigError(
                f"epsilon bounds need 0 < epsilon_min <= epsilon_max; got "
                f"[{self.epsilon_min}, {self.epsilon_max}]"
            )

    def observe(self, round_: int, loss: float) -> None:
        """Record L(M_round) (round 0 is the initial model); rounds must come in order."""
        expected = self.start + len(self.losses)
        if round_ != expected:
            raise ConfigError(
                f"the budget schedule expects the loss of round {expected}; got round {round_}"
            )
        self.losses.append(float(loss))

    def reset(self, losses: Sequence[float], start: int = 0) -> None:
        """Rebuild the state from the losses of rounds start..start+n-1 (``--resume``)."""
        self.losses = [float(v) for v in losses]
        self.start = int(start)

    def epsilon(self, round_: int) -> float:
        """Return ε of round ``round_`` (1-based); needs the losses of rounds start..round-1."""
        if not self.start + 1 <= round_ <= self.start + len(self.losses):
            raise ConfigError(
                f"epsilon of round {round_} needs the losses of rounds {self.start}.."
                f"{round_ - 1}; the schedule has {len(self.losses)} from round {self.start}"
            )
        return epsilon_sequence(
            self.losses[: round_ - self.start],
            self.epsilon_initial,
            self.epsilon_min,
            self.epsilon_max,
            signed_delta=self.signed_delta,
        )[-1]
