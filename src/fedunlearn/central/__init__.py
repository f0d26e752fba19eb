"""Centralised sample unlearning: Mini-Unlearning and its baselines on one recorded SGD run.

Train with ``train_sgd`` (a ``TrainingRecord``), then call
``make_method(name, params).unlearn(objective, record, forget)``. Methods: ``mini_unlearning``,
``deltagrad``, ``certified_removal``, ``amnesiac``, and the reference rows ``original``,
``replay`` and ``retrain``.

Paper: Huang et al., "Machine Unlearning with Minimal Gradient Dependence for High Unlearning
Ratios" (Mini-Unlearning), §4, and the baselines it compares with in §5.1 (DeltaGrad, Certified
Data Removal, Amnesiac Unlearning, retraining).
Deviations: tagged per module; argued in docs/methods/mini_unlearning.md (MU) and
docs/methods/central_baselines.md (DG, CR, AM, RF).
"""

from fedunlearn.central import methods
from fedunlearn.central.base import CentralResult, CentralUnlearner, Outcome
from fedunlearn.central.hvp import ExactOracle, ExplicitOracle, HessianOracle, LBFGSOracle
from fedunlearn.central.objectives import (
    AutogradObjective,
    Objective,
    RidgeRegression,
    SoftmaxRegression,
)
from fedunlearn.central.recursion import (
    StepView,
    contraction_diagnostics,
    correction,
    spectral_norm,
    step_view,
    unroll_explicit,
    unroll_horner,
    unroll_terms,
)
from fedunlearn.central.registry import (
    METHODS,
    available_methods,
    get_method,
    make_method,
    register,
)
from fedunlearn.central.trainer import (
    SGDSpec,
    TrainingRecord,
    forget_mask,
    fresh_retrain,
    replay_retrain,
    sample_batches,
    train_sgd,
)

del methods

__all__ = [
    "METHODS",
    "AutogradObjective",
    "CentralResult",
    "CentralUnlearner",
    "ExactOracle",
    "ExplicitOracle",
    "HessianOracle",
    "LBFGSOracle",
    "Objective",
    "Outcome",
    "RidgeRegression",
    "SGDSpec",
    "SoftmaxRegression",
    "StepView",
    "TrainingRecord",
    "available_methods",
    "contraction_diagnostics",
    "correction",
    "forget_mask",
    "fresh_retrain",
    "get_method",
    "make_method",
    "register",
    "replay_retrain",
    "sample_batches",
    "spectral_norm",
    "step_view",
    "train_sgd",
    "unroll_explicit",
    "unroll_horner",
    "unroll_terms",
]
