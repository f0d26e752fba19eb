"""Differential privacy of training: mechanisms, adaptive budgets and accounting.

``schedule`` (Eq. 4 budget ε_t), ``accountant`` (dp-accounting: RDP and PLD totals, analytic
Gaussian, sampled-Gaussian events and σ calibration), ``calibrate`` (clip norm "auto"),
``ledger`` (per-round ledger and its summary), ``training`` (the DP state of one training run)
and the two mechanisms of ``privacy.mechanism``:

- ``client_update`` (FedADP Eq. 5-6): ``mechanisms`` (clip, noise: pure functions) and
  ``uploads`` (the clip-and-noise update mod); client-level guarantee.
- ``dp_sgd``: ``per_example`` (clipped per-example gradient sums: vmap(grad), ghost clipping),
  ``dp_sgd`` (one client's DP-SGD, the reference), ``dp_sgd_vectorized`` (all clients at once)
  and ``local_training`` (the ``Federation.local_training`` hook); per-example guarantee.

Paper: FedADP (Jiang et al.), Sec. IV-B1, Eq. 4-6 and Alg. 1; DP-SGD (Abadi et al., CCS 2016,
Alg. 1). User guide: docs/privacy.md; deviations (AD1-AD22): docs/methods/fedadp.md.
"""

from fedunlearn.privacy.accountant import (
    PrivacyAccountant,
    PrivacyTotals,
    SampledGaussian,
    analytic_gaussian_epsilon,
    calibrate_sampled_gaussian,
    sampled_totals,
    totals,
    zcdp_epsilon,
)
from fedunlearn.privacy.calibrate import gradient_clip_norm, pilot_clip_norm
from fedunlearn.privacy.dp_sgd import dp_sgd_update
from fedunlearn.privacy.dp_sgd_vectorized import VectorizedDPSGD
from fedunlearn.privacy.ledger import privacy_summary
from fedunlearn.privacy.local_training import DPSGDTraining, RoundDPSGD
from fedunlearn.privacy.mechanisms import (
    clip,
    gaussian_noise,
    noise_multiplier,
    noise_std,
    privatize,
)
from fedunlearn.privacy.per_example import (
    GhostClipping,
    LinearGhostClipping,
    per_example_clipped_sum,
)
from fedunlearn.privacy.schedule import BudgetSchedule, epsilon_sequence, next_epsilon
from fedunlearn.privacy.training import PrivateTraining
from fedunlearn.privacy.uploads import ClipAndNoise, RoundNoise

__all__ = [
    "BudgetSchedule",
    "ClipAndNoise",
    "DPSGDTraining",
    "GhostClipping",
    "LinearGhostClipping",
    "PrivacyAccountant",
    "PrivacyTotals",
    "PrivateTraining",
    "RoundDPSGD",
    "RoundNoise",
    "SampledGaussian",
    "VectorizedDPSGD",
    "analytic_gaussian_epsilon",
    "calibrate_sampled_gaussian",
    "clip",
    "dp_sgd_update",
    "epsilon_sequence",
    "gaussian_noise",
    "gradient_clip_norm",
    "next_epsilon",
    "noise_multiplier",
    "noise_std",
    "per_example_clipped_sum",
    "pilot_clip_norm",
    "privacy_summary",
    "privatize",
    "sampled_totals",
    "totals",
    "zcdp_epsilon",
]
