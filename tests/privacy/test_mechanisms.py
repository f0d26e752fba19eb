"""Clipping, noise calibration and the DP update mod (FedADP Eq. 5-6; AD2 in fedadp.md)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedunlearn.errors import ConfigError
from fedunlearn.fl.records import ClientUpdate
from fedunlearn.privacy.mechanisms import (
    clip,
    gaussian_noise,
    noise_multiplier,
    noise_std,
    privatize,
)
from fedunlearn.privacy.uploads import ClipAndNoise


@settings(max_examples=50, deadline=None)
@given(
    st.integers(1, 300),
    st.floats(1e-3, 1e3),
    st.floats(1e-4, 1e4),
    st.integers(0, 2**31 - 1),
)
def test_clipped_norm_never_exceeds_the_clip_norm(d, scale, clip_norm, seed):
    g = torch.randn(d, generator=torch.Generator().manual_seed(seed)) * scale
    out = clip(g, clip_norm)
    assert float(out.norm()) <= clip_norm * (1 + 1e-6)
    if float(g.norm()) <= clip_norm:
        assert torch.equal(out, g)
    else:  # direction kept
        assert torch.allclose(out / out.norm(), g / g.norm(), atol=1e-5)


def test_noise_multiplier_matches_the_worked_number():
    # FedADP Eq. 6: delta = 1e-5 gives sqrt(2 ln(1.25/delta)) = 4.845; at eps = 3, z = 1.6149
    assert noise_multiplier(3.0, 1e-5) == pytest.approx(1.6149, abs=1e-4)
    assert noise_multiplier(1.0, 1e-5) == pytest.approx(4.8448, abs=1e-4)


def test_empirical_noise_std_is_within_two_percent_of_s_times_z():
    clip_norm = 0.7
    z = noise_multiplier(3.0, 1e-5)
    std = noise_std(clip_norm, z)
    noise = gaussian_noise(torch.zeros(200_000), std, torch.Generator().manual_seed(0))
    assert float(noise.std()) == pytest.approx(clip_norm * z, rel=0.02)
    assert abs(float(noise.mean())) < 0.01 * std


def test_paper_literal_counts_s_twice():
    z = noise_multiplier(3.0, 1e-5)
    assert noise_std(0.5, z, "paper_literal") == pytest.approx(0.25 * z)
    assert noise_std(0.5, z, "standard") == pytest.approx(0.5 * z)
    with pytest.raises(ConfigError, match="noise_mode must be one of standard, paper_literal"):
        noise_std(0.5, z, "double")  # type: ignore[arg-type]


@pytest.mark.parametrize(("eps", "delta"), [(0.0, 1e-5), (-1.0, 1e-5), (1.0, 0.0), (1.0, 1.0)])
def test_bad_budgets_are_rejected(eps, delta):
    with pytest.raises(ConfigError):
        noise_multiplier(eps, delta)


def test_privatize_is_seeded_and_adds_noise_to_the_clipped_vector():
    g = torch.full((1000,), 1.0)
    a, clipped = privatize(g, 2.0, 0.1, torch.Generator().manual_seed(5))
    b, _ = privatize(g, 2.0, 0.1, torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
    assert float(clipped.norm()) == pytest.approx(2.0, rel=1e-6)
    assert float((a - clipped).std()) == pytest.approx(0.1, rel=0.1)


def _updates(num=4, d=5000, scale=3.0):
    g = torch.Generator().manual_seed(1)
    return [
        ClientUpdate(c, torch.randn(d, generator=g) * scale / math.sqrt(d), 10 * (c + 1), 0.5)
        for c in range(num)
    ]


def test_mod_clips_noises_and_records_the_round():
    mod = ClipAndNoise(
        clip_norm=1.0, delta=1e-5, noise_mode="standard", seed=3, epsilon_of=lambda r: 3.0
    )
    ups = _updates()
    out = mod(7, torch.zeros(5000), ups)
    stats = mod.stats[7]
    assert stats.epsilon == 3.0
    assert stats.noise_multiplier == pytest.approx(1.6149, abs=1e-4)
    assert stats.clipped_fraction == 1.0  # every raw norm is about 3 > S = 1
    for u, o in zip(ups, out, strict=True):
        noisy, clipped = mod.privatize(7, u.client_id, u.delta)
        assert torch.equal(o.delta, noisy)  # the same seeded noise, reproducible later
        assert o.num_samples == u.num_samples
    # noise-to-signal of the weighted aggregate: ~ std sqrt(d sum w^2) / ||mean clipped||
    assert stats.noise_to_signal > 10


def test_store_only_mod_returns_the_clean_uploads():
    mod = ClipAndNoise(
        clip_norm=1.0,
        delta=1e-5,
        noise_mode="standard",
        seed=3,
        epsilon_of=lambda r: 2.0,
        perturb=False,
    )
    ups = _updates()
    out = mod(1, torch.zeros(5000), ups)
    assert all(torch.equal(a.delta, b.delta) for a, b in zip(ups, out, strict=True))
    assert 1 in mod.stats
