"""Evaluation of unlearning: membership inference, backdoor success, distances, the receipt.

The metrics judge a model given as (template module, flat parameters) and return plain numbers or
frozen values, so the same call scores the original, the unlearned and the retrained model alike.
``Verifier`` turns them into each result's receipt (``fedunlearn.eval.receipt``: one module per
rule; thresholds in
``VerificationThresholds``; docs/verification.md).
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
from fedunlearn.eval.plan import ReceiptOptions, Receipts, open_receipts
from fedunlearn.eval.receipt import Evidence, VerificationThresholds, build_verification
from fedunlearn.eval.references import client_membership_check, reference_retrain
from fedunlearn.eval.verifier import Verifier, deletion_evidence

__all__ = [
    "AttackSpec",
    "Evidence",
    "MIAResult",
    "ReceiptOptions",
    "Receipts",
    "ShadowAttack",
    "ShadowSpec",
    "VerificationThresholds",
    "Verifier",
    "attack_features",
    "backdoor_success_rate",
    "build_verification",
    "calibrate_loss_threshold",
    "client_backdoor_success_rate",
    "client_membership_check",
    "cosine_similarity",
    "deletion_evidence",
    "l2_distance",
    "loss_threshold_attack",
    "open_receipts",
    "prediction_agreement",
    "reference_retrain",
    "relative_distance",
]
