"""The Gaussian mechanism on client updates: L2 clipping, noise calibration, noise draws.

Pure functions; the update mod (:mod:`fedunlearn.privacy.uploads`) and the ``fedadp``
unlearning method (``unlearn_dp``) call them.

Paper: Jiang, Tong, Liu, Ye, Tan, Lam, "Efficient Federated Unlearning with Adaptive Differential
Privacy Preservation" (FedADP), Sec. IV-B1, Eq. 5 (clip and perturb) and Eq. 6 (σ);
deviation AD2 of docs/methods/fedadp.md.

Deviations:
    [REC] ``noise_mode="standard"`` (default): per-coordinate std = S·z with noise multiplier
        z = sqrt(2 ln(1.25/δ))/ε (the textbook Gaussian mechanism for L2 sensitivity S).
        ``"paper_literal"``: std = S²·z, Eq. 5 with Eq. 6 as printed (S counted twice; the
        guarantee is then ε/S at sensitivity S, AD2). S is in parameter-delta units.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from fedunlearn.errors import ConfigError

NoiseMode = Literal["standard", "paper_literal"]
NOISE_MODES = ("standard", "paper_literal")


def clip(delta: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """Return ``delta / max(1, ||delta|| / S)`` (Eq. 5, norm clipping), a new tensor."""
    if not clip_norm > 0:
        raise ConfigError(f"clip_norm S must be > 0; got {clip_norm}")
    norm = float(delta.to(torch.float64).norm())
    factor = 1.0 / max(1.0, norm / clip_norm)
    return delta * factor if factor < 1.0 else delta.clone()


def noise_multiplier(epsilon: float, delta: float) -> float:
    """Return z = sqrt(2 ln(1.25/δ)) / ε (Eq. 6 without S).

    Raises:
        ConfigError: unless ε > 0 and 0 < δ < 1.
    """
    if not epsilon > 0:
        raise ConfigError(f"epsilon must be > 0; got {epsilon}")
    if not 0 < delta < 1:
        raise ConfigError(f"delta must be in (0, 1); got {delta}")
    # Eq. 6: sigma_t = S sqrt(2 ln(1.25/delta)) / eps_t, here without the factor S
    return math.sqrt(2 * math.log(1.25 / delta)) / epsilon


def noise_std(clip_norm: float, multiplier: float, mode: NoiseMode = "standard") -> float:
    """Return the per-coordinate noise std: S·z (standard) or S²·z (paper_literal, Eq. 5)."""
    if mode == "standard":
        return clip_norm * multiplier
    if mode == "paper_literal":
        # Eq. 5 as printed: N(0, sigma_t^2 S^2 I) with sigma_t = S z
        return clip_norm * clip_norm * multiplier
    raise ConfigError(f"noise_mode must be one of {', '.join(NOISE_MODES)}; got {mode!r}")


def gaussian_noise(like: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """Return N(0, std² I) shaped like ``like`` (float32), drawn from ``generator``."""
    out = torch.empty(like.shape, dtype=torch.float32)
    if std == 0:
        return out.zero_()
    return out.normal_(0.0, std, generator=generator)


def privatize(
    delta: torch.Tensor, clip_norm: float, std: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip ``delta`` to S and add N(0, std² I); return (noisy, clipped) float32 vectors."""
    clipped = clip(delta.to(torch.float32), clip_norm)
    return clipped + gaussian_noise(clipped, std, generator), clipped
