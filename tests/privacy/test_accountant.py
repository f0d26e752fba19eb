"""The accountant against independent computations (FedADP Eq. 6; totals: AD14, fedadp.md)."""

from __future__ import annotations

import math

import pytest

from fedunlearn.errors import ConfigError
from fedunlearn.privacy.accountant import (
    RDP_ORDERS,
    PrivacyAccountant,
    SampledGaussian,
    analytic_gaussian_epsilon,
    calibrate_sampled_gaussian,
    rdp_epsilon,
    sampled_totals,
    totals,
    zcdp_epsilon,
)
from fedunlearn.privacy.mechanisms import noise_multiplier


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2))


def balle_wang_epsilon(z: float, delta: float) -> float:
    """Independent bisection on Balle & Wang's exact criterion (analytic Gaussian, ICML 2018)."""

    def delta_of(eps: float) -> float:
        return _phi(1 / (2 * z) - eps * z) - math.exp(eps) * _phi(-1 / (2 * z) - eps * z)

    lo, hi = 0.0, 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if delta_of(mid) <= delta else (mid, hi)
    return hi


@pytest.mark.parametrize(
    ("eps_t", "exact"), [(3.0, 2.533), (1.0, 0.751), (2.0, 1.610), (4.5, 4.019)]
)
def test_analytic_gaussian_matches_the_spec_and_an_independent_bisection(eps_t, exact):
    z = noise_multiplier(eps_t, 1e-5)
    ours = analytic_gaussian_epsilon(z, 1e-5)
    assert ours == pytest.approx(exact, abs=2e-3)
    assert ours == pytest.approx(balle_wang_epsilon(z, 1e-5), rel=1e-6)


@pytest.mark.parametrize(
    ("rounds", "eps_t", "expected"),
    [(40, 3.0, 26.46), (24, 3.0, 19.16), (40, 2.0, 15.94), (40, 4.5, 45.44)],
)
def test_zcdp_closed_form_matches_the_spec_table(rounds, eps_t, expected):
    z = noise_multiplier(eps_t, 1e-5)
    assert zcdp_epsilon([z] * rounds, 1e-5) == pytest.approx(expected, abs=0.01)


@pytest.mark.parametrize("rounds", [1, 10, 40])
def test_pld_total_equals_the_exact_composed_gaussian(rounds):
    # T Gaussian releases with noise multiplier z compose to one with z / sqrt(T): exact answer
    z = noise_multiplier(3.0, 1e-5)
    acc = PrivacyAccountant()
    for _ in range(rounds):
        acc.compose(z)
    exact = balle_wang_epsilon(z / math.sqrt(rounds), 1e-5)
    assert acc.pld_epsilon(1e-5) == pytest.approx(exact, rel=0.01)
    # RDP is an upper bound on the exact value and below the zCDP closed form
    assert exact * 0.999 <= acc.rdp_epsilon(1e-5) <= acc.zcdp_epsilon(1e-5) * 1.0001


def test_totals_of_a_mixed_schedule_and_more_rounds_never_lower_epsilon():
    zs = [noise_multiplier(e, 1e-5) for e in [1.0, 2.718, 3.0, 3.0, 3.0]]
    previous = 0.0
    for n in range(1, len(zs) + 1):
        t = totals(zs[:n], 1e-5)
        assert t.pld_epsilon >= previous
        previous = t.pld_epsilon
    t = totals(zs, 1e-5)
    assert t.basic_epsilon == pytest.approx(1.0 + 2.718 + 9.0)
    assert t.basic_delta == pytest.approx(5e-5)
    assert t.max_round_epsilon == pytest.approx(analytic_gaussian_epsilon(zs[-1], 1e-5))
    double = totals([z / 2 for z in zs], 1e-5, sens_factor=2)  # sensitivity 2S: z halves
    assert double.pld_epsilon > t.pld_epsilon


@pytest.mark.slow
def test_every_public_name_imports_and_dp_accounting_loads_lazily():
    import subprocess
    import sys

    code = (
        "import sys, fedunlearn.privacy as p\n"
        "assert all(getattr(p, n) is not None for n in p.__all__)\n"
        "assert 'dp_accounting' not in sys.modules\n"
        "p.analytic_gaussian_epsilon(1.0, 1e-5)\n"
        "assert 'dp_accounting' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ----- dp_sgd: sampled Gaussian events ------------------------------------------------------


@pytest.mark.parametrize(
    ("sample_rate", "sigma", "steps"),
    [(64 / 3000, 0.93, 235), (0.24, 1.57, 9), (0.01, 1.1, 1000), (0.1, 0.8, 50), (1.0, 3.0, 5)],
)
def test_sampled_gaussian_epsilon_equals_opacus_rdp_accountant(sample_rate, sigma, steps):
    from opacus.accountants import RDPAccountant

    opacus = RDPAccountant()
    opacus.history = [(sigma, sample_rate, steps)]
    expected = opacus.get_epsilon(1e-5)
    ours = rdp_epsilon(SampledGaussian(sigma, sample_rate, steps).event(), 1e-5)
    assert ours == pytest.approx(expected, rel=0.01)
    assert ours >= expected * 0.999  # both are upper bounds; Opacus has more orders below 2


@pytest.mark.parametrize(
    ("sample_rate", "steps", "epsilon"), [(64 / 3000, 235, 3.0), (0.24, 9, 1.0), (1.0, 5, 3.0)]
)
@pytest.mark.slow
def test_calibrated_sigma_spends_the_budget_and_equals_a_full_order_search(
    sample_rate, steps, epsilon
):
    import dp_accounting
    from dp_accounting import rdp

    sigma = calibrate_sampled_gaussian(sample_rate, steps, epsilon, 1e-5)
    achieved = rdp_epsilon(SampledGaussian(sigma, sample_rate, steps).event(), 1e-5)
    assert achieved <= epsilon
    assert achieved == pytest.approx(epsilon, rel=1e-4)
    slow = dp_accounting.calibrate_dp_mechanism(
        lambda: rdp.RdpAccountant(list(RDP_ORDERS)),
        lambda s: SampledGaussian(s, sample_rate, steps).event(),
        epsilon,
        1e-5,
        dp_accounting.LowerEndpointAndGuess(1e-2, 1.0),
    )
    assert sigma == pytest.approx(slow, rel=1e-4)
    less = calibrate_sampled_gaussian(sample_rate, steps, epsilon / 2, 1e-5)
    assert less > sigma  # a smaller budget needs more noise


def test_the_papers_setting_gives_a_noise_multiplier_near_one():
    # q = 64/3000 (B = 64, 3000 samples per client), E = 5 -> 235 steps, eps_t = 3, delta = 1e-5
    assert calibrate_sampled_gaussian(64 / 3000, 235, 3.0, 1e-5) == pytest.approx(0.93, abs=0.01)


@pytest.mark.slow
def test_sampled_totals_compose_the_rounds_as_dp_accounting_does_directly():
    import dp_accounting
    from dp_accounting import pld, rdp

    events = [SampledGaussian(1.2, 0.1, 20)] + [SampledGaussian(0.9, 0.12, 17)] * 3
    round_eps = [rdp_epsilon(e.event(), 1e-5) for e in events]
    t = sampled_totals(events, round_eps, 1e-5)
    steps = [
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(
                e.sample_rate, dp_accounting.GaussianDpEvent(e.noise_multiplier)
            ),
            e.steps,
        )
        for e in events
    ]
    composed = dp_accounting.ComposedDpEvent(steps)
    r = rdp.RdpAccountant(list(RDP_ORDERS)).compose(composed)
    p = pld.PLDAccountant(value_discretization_interval=1e-3).compose(composed)
    assert t.rdp_epsilon == pytest.approx(r.get_epsilon(1e-5), rel=1e-9)
    assert t.pld_epsilon == pytest.approx(p.get_epsilon(1e-5), rel=1e-6)
    assert t.pld_epsilon < t.rdp_epsilon < t.basic_epsilon == pytest.approx(sum(round_eps))
    assert t.to_dict().get("zcdp_epsilon") is None
    assert t.basic_delta == pytest.approx(4e-5)
    acc, previous = PrivacyAccountant(), 0.0
    for e in events:  # more rounds never lower epsilon
        acc.compose(e.noise_multiplier, e.sample_rate, e.steps)
        assert acc.pld_epsilon(1e-5) >= previous
        previous = acc.pld_epsilon(1e-5)
    with pytest.raises(ConfigError, match="zCDP closed form covers unsampled"):
        acc.zcdp_epsilon(1e-5)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0.0, 0.1, 3), "noise multiplier must be > 0"),
        ((1.0, 1.5, 3), "sample rate q must be in"),
        ((1.0, 0.1, 0), "steps must be >= 1"),
    ],
)
def test_bad_sampled_events_name_the_value(args, message):
    with pytest.raises(ConfigError, match=message):
        SampledGaussian(*args)
