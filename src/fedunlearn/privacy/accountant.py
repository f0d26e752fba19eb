"""Privacy accounting of the per-round Gaussian releases with Google's ``dp-accounting``.

Each client release of round t is a Gaussian mechanism with noise multiplier (std over L2
sensitivity) ζ_t = std_t / (sens_factor · S). One round is one ``GaussianDpEvent(ζ_t)``
(full participation, no subsampling); T rounds compose. Reported, at a target δ:

- nominal ε_t per round and basic composition Σ ε_t (with δ_total = T δ);
- the exact per-round ε of each Gaussian release (analytic Gaussian mechanism, Balle & Wang
  2018, ``dp_accounting.get_epsilon_gaussian``);
- the total ε by RDP (``dp_accounting.rdp.RdpAccountant``) and PLD
  (``dp_accounting.pld.PLDAccountant``) composition of the per-round events;
- zCDP for comparison with the spec's table: ρ = Σ 1/(2ζ_t²), ε = ρ + 2 sqrt(ρ ln(1/δ)).

Paper: FedADP (Jiang et al.) gives per-round (ε_t, δ) only (Eq. 6, Theorem 1); there is no
composition in the paper. FedADP spec §3.7 and A14.

``dp_accounting`` is imported on first use: importing it (and scipy) takes seconds, and every
``fedunlearn`` command imports this module.

Deviations:
    [REC] Sensitivity S (``sens_factor=1``, add/remove a client's contribution, the paper's
        calibration) is the headline; ``sens_factor=2`` (replace adjacency) is reported too.
    [REC] The loss values that drive the budget and the stage triggers are computed on client
        data without noise: a small leak the ledger does not account (spec §3.7).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedunlearn.errors import ConfigError

if TYPE_CHECKING:
    import dp_accounting

PLD_DISCRETIZATION = 1e-3


def analytic_gaussian_epsilon(noise_multiplier: float, delta: float) -> float:
    """Return the exact ε at δ of one Gaussian release, ζ = std / sensitivity (Balle-Wang)."""
    _check(noise_multiplier, delta)
    import dp_accounting

    return float(dp_accounting.get_epsilon_gaussian(noise_multiplier, delta))


def zcdp_epsilon(noise_multipliers: Sequence[float], delta: float) -> float:
    """Return ε(δ) of the composed releases by zCDP: ρ = Σ 1/(2ζ²), ρ + 2 sqrt(ρ ln(1/δ))."""
    for z in noise_multipliers:
        _check(z, delta)
    rho = sum(1 / (2 * z * z) for z in noise_multipliers)
    return rho + 2 * math.sqrt(rho * math.log(1 / delta))


def _check(noise_multiplier: float, delta: float) -> None:
    if not noise_multiplier > 0:
        raise ConfigError(f"noise multiplier must be > 0; got {noise_multiplier}")
    if not 0 < delta < 1:
        raise ConfigError(f"delta must be in (0, 1); got {delta}")


class PrivacyAccountant:
    """Composes one Gaussian event per round; answers total ε by RDP, PLD and zCDP.

    Equal noise multipliers are composed as one self-composed event (most rounds run at ε_max),
    which keeps PLD composition fast.
    """

    def __init__(self) -> None:
        self.noise_multipliers: list[float] = []

    def compose(self, noise_multiplier: float) -> None:
        """Add one round's Gaussian release with std/sensitivity ``noise_multiplier``."""
        _check(noise_multiplier, 0.5)
        self.noise_multipliers.append(float(noise_multiplier))

    def event(self) -> dp_accounting.DpEvent:
        """Return the composed ``DpEvent`` of every round so far."""
        import dp_accounting

        counts = Counter(self.noise_multipliers)
        return dp_accounting.ComposedDpEvent(
            [
                dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), n)
                for z, n in sorted(counts.items())
            ]
        )

    def rdp_epsilon(self, delta: float) -> float:
        """Return the total ε at δ by RDP composition."""
        if not self.noise_multipliers:
            return 0.0
        from dp_accounting import rdp

        acc = rdp.RdpAccountant()
        acc.compose(self.event())
        return float(acc.get_epsilon(delta))

    def pld_epsilon(self, delta: float) -> float:
        """Return the total ε at δ by PLD composition (discretisation 1e-3)."""
        if not self.noise_multipliers:
            return 0.0
        from dp_accounting import pld

        acc = pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
        acc.compose(self.event())
        return float(acc.get_epsilon(delta))

    def zcdp_epsilon(self, delta: float) -> float:
        """Return the total ε at δ by the zCDP closed form."""
        return zcdp_epsilon(self.noise_multipliers, delta) if self.noise_multipliers else 0.0


@dataclass(frozen=True)
class PrivacyTotals:
    """Total privacy loss of a run at one δ and one sensitivity factor."""

    delta: float
    sens_factor: int
    rounds: int
    basic_epsilon: float
    basic_delta: float
    rdp_epsilon: float
    pld_epsilon: float
    zcdp_epsilon: float
    max_round_epsilon: float  # exact (analytic Gaussian) ε of the noisiest round

    def to_dict(self) -> dict[str, float | int]:
        """Return the totals as a JSON-ready dict."""
        return dict(self.__dict__)


def totals(noise_multipliers: Sequence[float], delta: float, sens_factor: int = 1) -> PrivacyTotals:
    """Return the totals of rounds with ζ_t = ``noise_multipliers`` (already per sens_factor).

    Basic composition sums the classic-bound ε of each release, sqrt(2 ln(1.25/δ)) / ζ_t (the
    nominal ε_t in ``standard`` mode at sensitivity S; ε_t / S in ``paper_literal`` mode).
    """
    acc = PrivacyAccountant()
    for z in noise_multipliers:
        acc.compose(z)
    smallest = min(noise_multipliers, default=0.0)
    return PrivacyTotals(
        delta=delta,
        sens_factor=sens_factor,
        rounds=len(noise_multipliers),
        basic_epsilon=sum(math.sqrt(2 * math.log(1.25 / delta)) / z for z in noise_multipliers),
        basic_delta=len(noise_multipliers) * delta,
        rdp_epsilon=acc.rdp_epsilon(delta),
        pld_epsilon=acc.pld_epsilon(delta),
        zcdp_epsilon=acc.zcdp_epsilon(delta),
        max_round_epsilon=analytic_gaussian_epsilon(smallest, delta) if smallest else 0.0,
    )
