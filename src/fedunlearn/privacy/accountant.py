"""Privacy accounting of the per-round releases with Google's ``dp-accounting``.

Two kinds of round event, one per ``privacy.mechanism``:

- ``client_update``: each client release of round t is a Gaussian mechanism with noise
  multiplier (std over L2 sensitivity) ζ_t = std_t / (sens_factor · S). One round is one
  ``GaussianDpEvent(ζ_t)`` (full participation, no subsampling).
- ``dp_sgd``: a round is ``steps`` sampled Gaussian steps on one client's data, i.e.
  ``SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(σ_t)), steps)`` (Abadi et al.
  2016; Mironov, Talwar, Zhang 2019). σ_t is calibrated so that the round costs ε_t at δ by
  RDP at the add/remove-one-example relation (``calibrate_sampled_gaussian``), the relation
  the budget ε_t is set in.

Neighbour relations (``Relation``): ``add_remove_one`` (one record added or removed) and
``replace_one`` (one record replaced by another). The guarantee a run states is
``replace_one`` (``GUARANTEE_RELATION``): every upload carries its client's exact sample count,
and q, the step count and the FedAvg weights follow from it, so adding or removing a record is
visible and add/remove cannot hold. dp-accounting's PLD accountant composes Poisson-sampled
Gaussians under ``REPLACE_ONE`` (one record's clipped contribution moves by C one way and its
replacement's by C the other); its RDP accountant does not, so a ``dp_sgd`` total under
``replace_one`` has no RDP figure (None). A Gaussian release without sampling under
``replace_one`` is the add/remove one at twice the sensitivity (``client_update``'s factor 2).

T rounds compose. Reported, at a target δ:

- nominal ε_t per round and basic composition Σ ε_t (with δ_total = T δ);
- the exact per-round ε of each Gaussian release (analytic Gaussian mechanism, Balle & Wang
  2018, ``dp_accounting.get_epsilon_gaussian``);
- the total ε by RDP (``dp_accounting.rdp.RdpAccountant``) and PLD
  (``dp_accounting.pld.PLDAccountant``) composition of the per-round events;
- zCDP, a closed form to compare with: ρ = Σ 1/(2ζ_t²), ε = ρ + 2 sqrt(ρ ln(1/δ)).

Paper: FedADP (Jiang et al.) gives per-round (ε_t, δ) only (Eq. 6, Theorem 1); there is no
composition in the paper. Deviation AD14 of docs/methods/fedadp.md.

RDP uses the orders ``RDP_ORDERS`` (dp-accounting's default grid from order 2 to 512): the default's
orders 1.1-1.9 fail to converge for subsampled events (dp-accounting logs a warning per order and
drops them) and only matter at per-event ε far above any budget used here.

``dp_accounting`` is imported on first use: importing it (and scipy) takes seconds, and every
``fedunlearn`` command imports this module.

Deviations:
    [REC] The paper states ε_t at sensitivity S (add/remove a client's contribution); the
        guarantee here is stated at ``replace_one`` (sensitivity 2S for a client's update,
        2C-apart clipped gradients for an example), since the sample counts are public;
        ``add_remove_one`` is reported beside it (issue 40, docs/privacy.md).
    [REC] The loss values that drive the budget and the stage triggers are computed on client
        data without noise: a small leak the ledger does not account (AD3).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from fedunlearn.errors import ConfigError

if TYPE_CHECKING:
    import dp_accounting

PLD_DISCRETIZATION = 1e-3
#: The neighbour relations accounted (see the module doc).
Relation = Literal["add_remove_one", "replace_one"]
#: The relation a run's guarantee is stated in: the sample counts are public (module doc).
GUARANTEE_RELATION: Relation = "replace_one"
#: RDP orders: dp-accounting's default grid without the orders below 2 (see module doc).
RDP_ORDERS = tuple([1 + x / 10.0 for x in range(10, 100)] + list(range(11, 64)) + [128, 256, 512])


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


@dataclass(frozen=True, order=True)
class SampledGaussian:
    """``steps`` Gaussian releases, each on a Poisson sample of rate ``sample_rate``.

    ``sample_rate = 1`` is the plain Gaussian mechanism (``client_update``'s round event).

    Attributes:
        noise_multiplier: σ, noise std over L2 sensitivity.
        sample_rate: q, each record's inclusion probability (Poisson sampling), in (0, 1].
        steps: Number of releases composed.
    """

    noise_multiplier: float
    sample_rate: float = 1.0
    steps: int = 1

    def __post_init__(self) -> None:
        _check(self.noise_multiplier, 0.5)
        if not 0 < self.sample_rate <= 1:
            raise ConfigError(f"sample rate q must be in (0, 1]; got {self.sample_rate}")
        if self.steps < 1:
            raise ConfigError(f"steps must be >= 1; got {self.steps}")

    def event(self, count: int = 1) -> dp_accounting.DpEvent:
        """Return this release composed ``count`` times as a ``DpEvent``."""
        import dp_accounting

        one: dp_accounting.DpEvent = dp_accounting.GaussianDpEvent(self.noise_multiplier)
        if self.sample_rate < 1:
            one = dp_accounting.PoissonSampledDpEvent(self.sample_rate, one)
        return dp_accounting.SelfComposedDpEvent(one, self.steps * count)


def rdp_epsilon(event: dp_accounting.DpEvent, delta: float, *, sampled: bool = True) -> float:
    """Return ε at δ of ``event`` by RDP (orders ``RDP_ORDERS`` if ``sampled``, else the default).

    Unsampled Gaussian events keep dp-accounting's default orders: their ε is exact in closed
    form at every order, and the orders below 2 matter for totals above ~40.
    """
    from dp_accounting import rdp

    acc = rdp.RdpAccountant(list(RDP_ORDERS) if sampled else None)
    acc.compose(event)
    return float(acc.get_epsilon(delta))


def _neighbouring(relation: Relation) -> dp_accounting.NeighboringRelation:
    import dp_accounting

    if relation == "replace_one":
        return dp_accounting.NeighboringRelation.REPLACE_ONE
    if relation == "add_remove_one":
        return dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    raise ConfigError(f"unknown neighbour relation {relation!r}; use add_remove_one or replace_one")


def pld_epsilon(
    event: dp_accounting.DpEvent, delta: float, relation: Relation = "add_remove_one"
) -> float:
    """Return ε at δ of ``event`` by PLD (discretisation ``PLD_DISCRETIZATION``) at ``relation``.

    Cached for hashable events (one round's, which ledgers ask for again and again).
    """
    try:
        return _cached_pld_epsilon(event, delta, relation)
    except TypeError:  # a composed event holds a list: not hashable
        return _pld_epsilon(event, delta, relation)


@functools.lru_cache(maxsize=1024)
def _cached_pld_epsilon(event: dp_accounting.DpEvent, delta: float, relation: Relation) -> float:
    return _pld_epsilon(event, delta, relation)


def _pld_epsilon(event: dp_accounting.DpEvent, delta: float, relation: Relation) -> float:
    from dp_accounting import pld

    acc = pld.PLDAccountant(
        neighboring_relation=_neighbouring(relation),
        value_discretization_interval=PLD_DISCRETIZATION,
    )
    acc.compose(event)
    return float(acc.get_epsilon(delta))


#: Integer orders: the first, coarse pass of ``calibrate_sampled_gaussian`` (fast to evaluate).
COARSE_ORDERS = tuple(range(2, 64)) + (128, 256, 512)


@functools.lru_cache(maxsize=256)
def calibrate_sampled_gaussian(
    sample_rate: float, steps: int, epsilon: float, delta: float
) -> float:
    """Return the smallest σ for which ``steps`` sampled Gaussian steps cost at most ε at δ (RDP).

    Bisection (Brent's method, then a check that the gap is not positive, to 1e-6 in σ) by
    ``dp_accounting.calibrate_dp_mechanism``, in two passes that keep it fast: over the integer
    orders ``COARSE_ORDERS`` first, then over the orders of ``RDP_ORDERS`` within a factor 1.5
    of the optimal order at that σ. Every RDP order gives a valid bound, so the answer meets ε
    by ``RDP_ORDERS`` too; it equals a search over all of them to ~1e-4 (tested). Cached by its
    arguments, since ε_t of the Eq. 4 schedule repeats across rounds.

    Raises:
        ConfigError: unless ε > 0, 0 < δ < 1, 0 < q <= 1 and steps >= 1.
    """
    if not epsilon > 0:
        raise ConfigError(f"epsilon must be > 0; got {epsilon}")
    SampledGaussian(1.0, sample_rate, steps)  # validates q and steps
    _check(1.0, delta)
    from dp_accounting import rdp

    coarse = _calibrate(sample_rate, steps, epsilon, delta, COARSE_ORDERS)
    acc = rdp.RdpAccountant(list(RDP_ORDERS))
    acc.compose(SampledGaussian(coarse, sample_rate, steps).event())
    _, best = acc.get_epsilon_and_optimal_order(delta)
    window = tuple(a for a in RDP_ORDERS if best / 1.5 <= a <= best * 1.5)
    return _calibrate(sample_rate, steps, epsilon, delta, window)


def _calibrate(
    sample_rate: float, steps: int, epsilon: float, delta: float, orders: Sequence[float]
) -> float:
    """Return σ from ``dp_accounting.calibrate_dp_mechanism`` with RDP over ``orders``."""
    import dp_accounting
    from dp_accounting import rdp

    return float(
        dp_accounting.calibrate_dp_mechanism(
            lambda: rdp.RdpAccountant(list(orders)),
            lambda sigma: SampledGaussian(sigma, sample_rate, steps).event(),
            epsilon,
            delta,
            dp_accounting.LowerEndpointAndGuess(1e-2, 1.0),
            tol=1e-6,
        )
    )


class PrivacyAccountant:
    """Composes one event per round; answers total ε by RDP, PLD and (Gaussian only) zCDP.

    Equal events are composed as one self-composed event (most rounds run at ε_max), which keeps
    PLD composition fast.
    """

    def __init__(self) -> None:
        self.events: list[SampledGaussian] = []

    @property
    def sampled(self) -> bool:
        """Whether a round is a subsampled or multi-step event (``dp_sgd``)."""
        return any(e.sample_rate < 1 or e.steps != 1 for e in self.events)

    @property
    def noise_multipliers(self) -> list[float]:
        """σ (or ζ) of every round so far."""
        return [e.noise_multiplier for e in self.events]

    def compose(self, noise_multiplier: float, sample_rate: float = 1.0, steps: int = 1) -> None:
        """Add one round: ``steps`` releases with σ ``noise_multiplier`` on rate-q samples."""
        self.events.append(SampledGaussian(float(noise_multiplier), float(sample_rate), steps))

    def event(self) -> dp_accounting.DpEvent:
        """Return the composed ``DpEvent`` of every round so far."""
        import dp_accounting

        counts = Counter(self.events)
        return dp_accounting.ComposedDpEvent([e.event(n) for e, n in sorted(counts.items())])

    def rdp_epsilon(self, delta: float) -> float:
        """Return the total ε at δ by RDP composition."""
        if not self.events:
            return 0.0
        return rdp_epsilon(self.event(), delta, sampled=self.sampled)

    def pld_epsilon(self, delta: float, relation: Relation = "add_remove_one") -> float:
        """Return the total ε at δ by PLD composition (discretisation 1e-3) at ``relation``."""
        return pld_epsilon(self.event(), delta, relation) if self.events else 0.0

    def zcdp_epsilon(self, delta: float) -> float:
        """Return the total ε at δ by the zCDP closed form (unsampled single releases only).

        Raises:
            ConfigError: if a round is a sampled or multi-step event (no closed form).
        """
        if self.sampled:
            raise ConfigError("the zCDP closed form covers unsampled Gaussian rounds only")
        return zcdp_epsilon(self.noise_multipliers, delta) if self.events else 0.0


@dataclass(frozen=True)
class PrivacyTotals:
    """Total privacy loss of a run at one δ and one sensitivity factor."""

    delta: float
    sens_factor: int
    rounds: int
    basic_epsilon: float
    basic_delta: float
    rdp_epsilon: float | None  # None: dp_sgd under replace_one (no RDP accountant for it)
    pld_epsilon: float
    zcdp_epsilon: float | None  # None for dp_sgd: no closed form for sampled events
    max_round_epsilon: float  # tightest ε of the costliest round (analytic Gaussian or PLD)
    relation: Relation = "add_remove_one"

    def to_dict(self) -> dict[str, float | int | str]:
        """Return the totals as a JSON-ready dict (fields that do not apply are left out)."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


def totals(noise_multipliers: Sequence[float], delta: float, sens_factor: int = 1) -> PrivacyTotals:
    """Return the totals of rounds with ζ_t = ``noise_multipliers`` (already per sens_factor).

    Basic composition sums the classic-bound ε of each release, sqrt(2 ln(1.25/δ)) / ζ_t (the
    nominal ε_t in ``standard`` mode at sensitivity S; ε_t / S in ``paper_literal`` mode).
    ``sens_factor`` 2 is the ``replace_one`` relation of a client's update (sensitivity 2S),
    1 is ``add_remove_one``.
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
        relation="replace_one" if sens_factor == 2 else "add_remove_one",
    )


def sampled_totals(
    events: Sequence[SampledGaussian],
    round_epsilons: Sequence[float],
    delta: float,
    relation: Relation = "add_remove_one",
) -> PrivacyTotals:
    """Return the totals of ``dp_sgd`` rounds (one example, per-example clip norm C).

    Args:
        events: One ``SampledGaussian`` per round (σ_t, q, steps).
        round_epsilons: Each round's own ε at δ under ``add_remove_one`` (RDP, what σ_t was
            calibrated to); basic composition sums them there. Under ``replace_one`` basic
            composition sums each round's own PLD ε at that relation instead.
        delta: δ of the totals.
        relation: The neighbour relation (``replace_one``: PLD only, ``rdp_epsilon`` None).
    """
    acc = PrivacyAccountant()
    for e in events:
        acc.compose(e.noise_multiplier, e.sample_rate, e.steps)
    per_round = {e: pld_epsilon(e.event(), delta, relation) for e in set(events)}
    replace = relation == "replace_one"
    return PrivacyTotals(
        delta=delta,
        sens_factor=1,
        rounds=len(events),
        basic_epsilon=float(sum(per_round[e] for e in events))
        if replace
        else float(sum(round_epsilons)),
        basic_delta=len(events) * delta,
        rdp_epsilon=None if replace or not events else acc.rdp_epsilon(delta),
        pld_epsilon=acc.pld_epsilon(delta, relation),
        zcdp_epsilon=None,
        max_round_epsilon=max(per_round.values(), default=0.0),
        relation=relation,
    )
