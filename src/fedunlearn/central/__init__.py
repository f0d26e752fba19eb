"""Centralised sample unlearning: Mini-Unlearning and its baselines on one recorded SGD run.

Train with ``train_sgd`` (a ``TrainingRecord``), then call
``make_method(name, params).unlearn(objective, record, forget)``. The core here (``base``,
``trainer``, ``objectives``, ``hvp``, ``recursion``, ``registry``) names no method: the methods
are plugins (``fedunlearn.plugins``, kind ``central_methods``), like the federated ones.
``mini_unlearning`` (plugin ``mini_unlearning``, package ``central.mini_unlearning``) and
``deltagrad``, ``certified_removal``, ``amnesiac`` and the reference rows ``original``,
``replay`` and ``retrain`` (plugin ``central_baselines``, package ``central.baselines``).
Names are imported on first use, so reading a plugin declaration does not load torch.

Paper: Huang et al., "Machine Unlearning with Minimal Gradient Dependence for High Unlearning
Ratios" (Mini-Unlearning), §4, and the baselines it compares with in §5.1 (DeltaGrad, Certified
Data Removal, Amnesiac Unlearning, retraining).
Deviations: tagged per module; argued in docs/methods/mini_unlearning.md (MU) and
docs/methods/central_baselines.md (DG, CR, AM, RF).
"""

from __future__ import annotations

from fedunlearn.exports import by_module, lazy_exports

_EXPORTS = by_module(
    {
        "fedunlearn.central.base": ("CentralResult", "CentralUnlearner", "Outcome"),
        "fedunlearn.central.hvp": ("ExactOracle", "ExplicitOracle", "HessianOracle", "LBFGSOracle"),
        "fedunlearn.central.objectives": (
            "AutogradObjective",
            "Objective",
            "RidgeRegression",
            "SoftmaxRegression",
        ),
        "fedunlearn.central.recursion": (
            "Engine",
            "StepView",
            "contraction_diagnostics",
            "correction",
            "spectral_norm",
            "step_view",
            "unroll",
            "unroll_explicit",
            "unroll_horner",
            "unroll_terms",
        ),
        "fedunlearn.central.registry": (
            "METHODS",
            "available_methods",
            "get_method",
            "make_method",
            "register",
            "registered",
        ),
        "fedunlearn.central.trainer": (
            "SGDSpec",
            "TrainingRecord",
            "forget_mask",
            "fresh_retrain",
            "replay_retrain",
            "sample_batches",
            "train_sgd",
        ),
    }
)

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
