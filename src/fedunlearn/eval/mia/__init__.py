"""Membership inference: does a model behave as if a sample was in its training set?

Two attacks on a model given as (template module, flat parameters), both reporting an
``MIAResult``:

- ``loss_threshold_attack`` (Yeom et al.): a sample is called a member iff its cross-entropy loss
  is at most a threshold.
- ``ShadowAttack`` (Shokri et al.): shadow models of the target's architecture are trained on
  random halves of a held-out pool; an attack classifier learns to tell their outputs on the
  "in" half from those on the "out" half and is then applied to the target model's outputs.
  Fit once, then evaluate many models (original, each unlearned model, retrained).
  ``ShadowAttack.fit_reference`` is the variant of the Crab and FedADP papers: the attack is
  fitted on one reference model's outputs on known members and non-members.

A third test works at the client level and on a whole run (``client_lira``, LiRA-style):
``measure_client_membership(session, forget, models)`` (or ``fit_client_membership`` once, then
``evidence(models)``) trains reference runs with and without the forgotten clients and reports a
``ClientMembershipEvidence`` with each model's score, a threshold at a target false-positive rate
and the measured power (docs/verification.md, "Client-level membership test").

An ``MIAResult``'s ``member_rate`` on the forgotten clients' data is the papers' MISR (Crab
Sec. V-A3, FedADP Sec. VI-A3) or MIA-ASR (Starfish Sec. VI-A): the share of those samples called
"member". Lower means less trace of the data; retraining gives the target level (EV4 in
docs/evaluation.md, where every choice below is explained).

Papers: Shokri et al., "Membership Inference Attacks Against Machine Learning Models", IEEE S&P
2017, §IV (shadow training, attack model); Yeom et al., "Privacy Risk in Machine Learning:
Analyzing the Connection to Overfitting", IEEE CSF 2018 (the membership adversary that
thresholds the per-sample loss at the expected training loss).
Deviations:
    [REC] Attack features are the softmax vector sorted in descending order (optionally its top
    k) plus the loss on the true label (EV7; Mini-Unlearning's Sec. 5.1 gives no features);
    Shokri's one attack model per class is optional (``AttackSpec.per_class``).
    [REC] The attack classifier is a logistic regression or scikit-learn's histogram gradient
    boosting, not Shokri's neural network or the Crab code's 500-tree XGBoost (CPU budget); it
    is fitted with class weights balancing "in" and "out", on one thread (EV7).
    [REC] Shadow models start from a seeded re-initialisation of the template (every submodule
    with ``reset_parameters``) and train with ``fl.client.local_update``.
    [REC] Yeom's threshold is the expected training loss. By default ``loss_threshold_attack``
    instead picks the threshold on a seeded calibration split of the given samples (Youden's J);
    pass ``threshold=`` the mean training loss for Yeom's attack, or the output of
    ``calibrate_loss_threshold`` on reference data (EV8: Starfish names no attack).
    [REC] ``precision`` is taken at equal priors, TPR / (TPR + FPR), i.e. on a balanced
    evaluation set, whatever the numbers of members and non-members passed (EV9).
"""

from fedunlearn.eval.mia.client import ClientMembershipEvidence
from fedunlearn.eval.mia.client_lira import (
    ClientMembershipTest,
    fit_client_membership,
    measure_client_membership,
)
from fedunlearn.eval.mia.common import AttackSpec, MIAResult, attack_features
from fedunlearn.eval.mia.loss import calibrate_loss_threshold, loss_threshold_attack
from fedunlearn.eval.mia.shadow import ShadowAttack, ShadowSpec

__all__ = [
    "AttackSpec",
    "ClientMembershipEvidence",
    "ClientMembershipTest",
    "MIAResult",
    "ShadowAttack",
    "ShadowSpec",
    "attack_features",
    "calibrate_loss_threshold",
    "fit_client_membership",
    "loss_threshold_attack",
    "measure_client_membership",
]
