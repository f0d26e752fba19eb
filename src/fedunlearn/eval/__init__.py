"""Evaluation metrics for unlearning: membership inference, backdoor success, model distances.

Everything here judges a model given as (template module, flat parameters) and returns plain
numbers or frozen values, so the same call scores the original, the unlearned and the retrained
model alike.
"""

from fedunlearn.eval.backdoor import backdoor_success_rate, client_backdoor_success_rate
from fedunlearn.eval.distance import (
    cosine_similarity,
    l2_distance,
    prediction_agreement,
    relative_distance,
)
from fedunlearn.eval.mia import (
    AttackSpec,
    MIAResult,
    ShadowAttack,
    ShadowSpec,
    attack_features,
    calibrate_loss_threshold,
    loss_threshold_attack,
)

__all__ = [
    "AttackSpec",
    "MIAResult",
    "ShadowAttack",
    "ShadowSpec",
    "attack_features",
    "backdoor_success_rate",
    "calibrate_loss_threshold",
    "client_backdoor_success_rate",
    "cosine_similarity",
    "l2_distance",
    "loss_threshold_attack",
    "prediction_agreement",
    "relative_distance",
]
