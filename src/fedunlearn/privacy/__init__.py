"""Differential privacy for client updates: clipping, noise, adaptive budgets and accounting.

``mechanisms`` (clip, noise: pure functions), ``schedule`` (Eq. 4 budget), ``accountant``
(dp-accounting: RDP and PLD totals, analytic Gaussian), ``uploads`` (the clip-and-noise update
mod), ``calibrate`` (S = "auto"), ``ledger`` (per-round ledger and its summary) and ``training``
(the DP state of one training run). Paper: FedADP (Jiang et al.); FedADP spec §3.
"""

from fedunlearn.privacy.accountant import (
    PrivacyAccountant,
    PrivacyTotals,
    analytic_gaussian_epsilon,
    totals,
    zcdp_epsilon,
)
from fedunlearn.privacy.calibrate import pilot_clip_norm
from fedunlearn.privacy.ledger import privacy_summary
from fedunlearn.privacy.mechanisms import (
    clip,
    gaussian_noise,
    noise_multiplier,
    noise_std,
    privatize,
)
from fedunlearn.privacy.schedule import BudgetSchedule, epsilon_sequence, next_epsilon
from fedunlearn.privacy.training import PrivateTraining
from fedunlearn.privacy.uploads import ClipAndNoise, RoundNoise

__all__ = [
    "BudgetSchedule",
    "ClipAndNoise",
    "PrivacyAccountant",
    "PrivacyTotals",
    "PrivateTraining",
    "RoundNoise",
    "analytic_gaussian_epsilon",
    "clip",
    "epsilon_sequence",
    "gaussian_noise",
    "next_epsilon",
    "noise_multiplier",
    "noise_std",
    "pilot_clip_norm",
    "privacy_summary",
    "privatize",
    "totals",
    "zcdp_epsilon",
]
