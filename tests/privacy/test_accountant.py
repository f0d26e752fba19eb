"""The accountant against independent computations (FedADP Eq. 6; totals: AD14, fedadp.md)."""

from __future__ import annotations

import math

import pytest

from fedunlearn.privacy.accountant import (
    PrivacyAccountant,
    analytic_gaussian_epsilon,
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
