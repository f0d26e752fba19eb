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

An ``MIAResult``'s ``member_rate`` on the forgotten clients' data is the papers' MISR (Crab spec
§4.3, FedADP spec §6.4) or MIA-ASR (Starfish spec §9.3): the share of those samples called
"member". Lower means less trace of the data; retraining gives the target level.

Papers: Shokri et al., "Membership Inference Attacks Against Machine Learning Models", IEEE S&P
2017, §IV (shadow training, attack model); Yeom et al., "Privacy Risk in Machine Learning:
Analyzing the Connection to Overfitting", IEEE CSF 2018 (the membership adversary that
thresholds the per-sample loss at the expected training loss).
Deviations:
    [REC] Attack features are the softmax vector sorted in descending order (optionally its top
    k) plus the loss on the true label (Mini-Unlearning spec §6, A13); Shokri's one attack model
    per class is optional (``AttackSpec.per_class``).
    [REC] The attack classifier is a logistic regression or scikit-learn's histogram gradient
    boosting, not Shokri's neural network or Crab's 500-tree XGBoost (CPU budget); it is
    fitted with class weights balancing "in" and "out", on one thread.
    [REC] Shadow models start from a seeded re-initialisation of the template (every submodule
    with ``reset_parameters``) and train with ``fl.client.local_update``.
    [REC] Yeom's threshold is the expected training loss. By default ``loss_threshold_attack``
    instead picks the threshold on a seeded calibration split of the given samples (Youden's J);
    pass ``threshold=`` the mean training loss for Yeom's attack, or the output of
    ``calibrate_loss_threshold`` on reference data (Starfish spec §11, A24).
    [REC] ``precision`` is taken at equal priors, TPR / (TPR + FPR), i.e. on a balanced
    evaluation set, whatever the numbers of members and non-members passed.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.fl.client import LocalTrainingSpec, local_update
from fedunlearn.fl.metrics import predict_logits
from fedunlearn.fl.records import ClientData
from fedunlearn.fl.seeding import derive_seed, torch_generator
from fedunlearn.models.flat import get_flat_params

CLASSIFIERS = ("logreg", "gboost")
MAX_SHADOWS = 256
MIN_CLASS_SAMPLES = 10  # per-class attack models need this many "in" and "out" samples


@dataclass(frozen=True)
class MIAResult:
    """Outcome of one membership-inference attack on one model.

    Attributes:
        attack: ``"loss_threshold"``, ``"shadow"`` or ``"reference"``.
        member_rate: Share of the member (target) samples called "member": MISR / MIA-ASR.
        nonmember_rate: Share of the non-member samples called "member" (false-positive rate).
        auc: ROC-AUC of the membership score, members against non-members (0.5 = chance).
        precision: Precision of "member" at equal priors, ``TPR / (TPR + FPR)``; nan if no
            sample was called "member".
        recall: Recall of "member" (equals ``member_rate``).
        balanced_accuracy: ``(member_rate + 1 - nonmember_rate) / 2``.
        threshold: The decision threshold: a loss for ``loss_threshold`` (member iff
            loss <= threshold), a probability for the classifier attacks (member iff >= it).
        num_members: Number of member samples scored.
        num_nonmembers: Number of non-member samples scored.
    """

    attack: str
    member_rate: float
    nonmember_rate: float
    auc: float
    precision: float
    recall: float
    balanced_accuracy: float
    threshold: float
    num_members: int
    num_nonmembers: int

    def to_dict(self) -> dict[str, Any]:
        """Return the fields as a plain dict (for results.json)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class AttackSpec:
    """Features and classifier of a learned membership attack.

    Attributes:
        top_k: Keep the k largest softmax probabilities; ``None`` keeps all classes.
        classifier: ``"logreg"`` (standardised features, logistic regression) or ``"gboost"``
            (``HistGradientBoostingClassifier``, 100 iterations).
        per_class: Also fit one classifier per true label (Shokri et al.); labels with fewer
            than ``MIN_CLASS_SAMPLES`` "in" or "out" samples use the global classifier.
    """

    top_k: int | None = None
    classifier: str = "logreg"
    per_class: bool = False

    def __post_init__(self) -> None:
        if self.top_k is not None and (not _is_int(self.top_k) or self.top_k < 1):
            raise ConfigError(f"AttackSpec.top_k must be None or an int >= 1; got {self.top_k!r}")
        if self.classifier not in CLASSIFIERS:
            raise ConfigError(
                f"AttackSpec.classifier must be one of {', '.join(CLASSIFIERS)}; "
                f"got {self.classifier!r}"
            )
        if not isinstance(self.per_class, bool):
            raise ConfigError(f"AttackSpec.per_class must be a bool; got {self.per_class!r}")


@dataclass(frozen=True)
class ShadowSpec:
    """Hyperparameters of the shadow-model attack (Shokri et al. 2017).

    Attributes:
        num_shadows: Number of shadow models, in [1, ``MAX_SHADOWS``].
        training: Local training of each shadow model (epochs >= 1); match the target's.
        in_fraction: Share of the shadow pool each shadow trains on ("in"), in (0, 1); the
            rest is its "out" data.
        attack: Features and classifier of the attack model.
    """

    num_shadows: int = 4
    training: LocalTrainingSpec = LocalTrainingSpec(epochs=20)
    in_fraction: float = 0.5
    attack: AttackSpec = AttackSpec()

    def __post_init__(self) -> None:
        if not _is_int(self.num_shadows) or not 1 <= self.num_shadows <= MAX_SHADOWS:
            raise ConfigError(
                f"ShadowSpec.num_shadows must be an int in [1, {MAX_SHADOWS}]; "
                f"got {self.num_shadows!r}"
            )
        if not isinstance(self.training, LocalTrainingSpec) or self.training.epochs < 1:
            raise ConfigError(
                "ShadowSpec.training must be a LocalTrainingSpec with epochs >= 1; "
                f"got {self.training!r}"
            )
        if not 0.0 < self.in_fraction < 1.0:
            raise ConfigError(f"ShadowSpec.in_fraction must lie in (0, 1); got {self.in_fraction}")
        if not isinstance(self.attack, AttackSpec):
            raise ConfigError(f"ShadowSpec.attack must be an AttackSpec; got {self.attack!r}")


# --- features -------------------------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _check_xy(x: torch.Tensor, y: torch.Tensor, what: str) -> None:
    if y.ndim != 1 or len(x) != len(y):
        raise ConfigError(
            f"{what}: need inputs (N, ...) and labels (N,); got shapes {tuple(x.shape)} and "
            f"{tuple(y.shape)}"
        )
    if len(y) == 0:
        raise ConfigError(f"{what}: no samples; pass at least one")


def _log_probs(
    model: nn.Module, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, what: str
) -> torch.Tensor:
    """Return float64 log-softmax outputs (N, classes) after checking the labels fit them."""
    _check_xy(x, y, what)
    log_probs = torch.log_softmax(predict_logits(model, params, x).to(torch.float64), dim=1)
    num_classes = log_probs.shape[1]
    if int(y.min()) < 0 or int(y.max()) >= num_classes:
        raise ConfigError(f"{what}: labels must lie in 0..{num_classes - 1} for this model")
    return log_probs


def _losses(log_probs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return -log_probs.gather(1, y.long().view(-1, 1)).squeeze(1)


def attack_features(
    model: nn.Module,
    params: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    top_k: int | None = None,
) -> np.ndarray:
    """Return the attack features of each sample: sorted softmax (top k), then its loss.

    Args:
        model: Template module (not modified).
        params: Flat parameters of the queried model.
        x: Inputs (N, ...).
        y: True labels (N,).
        top_k: Number of largest probabilities to keep; ``None`` keeps all.

    Returns:
        float64 array (N, k + 1): probabilities in descending order, then the cross-entropy.

    Raises:
        ConfigError: on empty or mismatched data, labels out of range, or ``top_k`` larger
            than the number of classes.
    """
    log_probs = _log_probs(model, params, x, y, "attack_features")
    num_classes = log_probs.shape[1]
    if top_k is not None and top_k > num_classes:
        raise ConfigError(f"top_k {top_k} exceeds the model's {num_classes} classes")
    probs = log_probs.exp().sort(dim=1, descending=True).values[:, : top_k or num_classes]
    return torch.cat([probs, _losses(log_probs, y).unsqueeze(1)], dim=1).numpy()


# --- scoring ---------------------------------------------------------------------------------


def _summarise(
    attack: str,
    member_scores: np.ndarray,
    nonmember_scores: np.ndarray,
    member_called: np.ndarray,
    nonmember_called: np.ndarray,
    threshold: float,
) -> MIAResult:
    """Build an MIAResult from membership scores (higher = more member-like) and decisions."""
    from sklearn.metrics import roc_auc_score  # lazy: scikit-learn is slow to import

    labels = np.concatenate([np.ones(len(member_scores)), np.zeros(len(nonmember_scores))])
    auc = float(roc_auc_score(labels, np.concatenate([member_scores, nonmember_scores])))
    tpr = float(np.mean(member_called))
    fpr = float(np.mean(nonmember_called))
    return MIAResult(
        attack=attack,
        member_rate=tpr,
        nonmember_rate=fpr,
        auc=auc,
        precision=tpr / (tpr + fpr) if tpr + fpr > 0 else math.nan,
        recall=tpr,
        balanced_accuracy=(tpr + 1.0 - fpr) / 2.0,
        threshold=float(threshold),
        num_members=len(member_scores),
        num_nonmembers=len(nonmember_scores),
    )


def _youden_loss_threshold(member_losses: np.ndarray, nonmember_losses: np.ndarray) -> float:
    """Return the loss threshold maximising TPR - FPR of "member iff loss <= threshold"."""
    from sklearn.metrics import roc_curve

    labels = np.concatenate([np.ones(len(member_losses)), np.zeros(len(nonmember_losses))])
    scores = -np.concatenate([member_losses, nonmember_losses])
    fpr, tpr, thresholds = roc_curve(labels, scores)
    best = int(np.argmax(tpr - fpr))  # first maximum: the strictest of equally good thresholds
    if not np.isfinite(thresholds[best]):  # nothing beats "nobody is a member"
        return float(np.nextafter(-scores.max(), -np.inf))
    return float(-thresholds[best])


def calibrate_loss_threshold(
    model: nn.Module,
    params: torch.Tensor,
    members_x: torch.Tensor,
    members_y: torch.Tensor,
    nonmembers_x: torch.Tensor,
    nonmembers_y: torch.Tensor,
) -> float:
    """Return the loss threshold that best separates known members from known non-members.

    The threshold maximises Youden's J = TPR - FPR of "member iff loss <= threshold". Starfish
    protocol (spec A24): calibrate on the remaining clients' data against test data, then pass
    the result as ``threshold`` to ``loss_threshold_attack`` on the forgotten client's data.

    Raises:
        ConfigError: on empty or mismatched data, or labels out of range.
    """
    member = _losses(_log_probs(model, params, members_x, members_y, "members"), members_y)
    nonmember = _losses(
        _log_probs(model, params, nonmembers_x, nonmembers_y, "non-members"), nonmembers_y
    )
    return _youden_loss_threshold(member.numpy(), nonmember.numpy())


def _split(
    n: int, fraction: float, generator: torch.Generator, what: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return a seeded (first ``round(fraction * n)``, rest) split of ``range(n)``."""
    count = round(fraction * n)
    if not 1 <= count <= n - 1:
        raise ConfigError(
            f"{what}: {n} samples cannot be split into a calibration part of {fraction:g} and a "
            "non-empty rest; pass more samples or a fixed threshold"
        )
    perm = torch.randperm(n, generator=generator)
    return perm[:count], perm[count:]


def loss_threshold_attack(
    model: nn.Module,
    params: torch.Tensor,
    members_x: torch.Tensor,
    members_y: torch.Tensor,
    nonmembers_x: torch.Tensor,
    nonmembers_y: torch.Tensor,
    *,
    threshold: float | None = None,
    calibration_fraction: float = 0.5,
    seed: int = 0,
) -> MIAResult:
    """Run the loss-threshold attack (Yeom et al. 2018): member iff loss <= threshold.

    The membership score is ``-loss``; the AUC needs no threshold.

    Args:
        model: Template module (not modified).
        params: Flat parameters of the attacked model.
        members_x: Inputs of the samples to test as members (e.g. the forgotten clients' data).
        members_y: Their labels.
        nonmembers_x: Inputs the model never saw (e.g. test data).
        nonmembers_y: Their labels.
        threshold: A fixed loss threshold, e.g. the mean training loss (Yeom's choice) or
            ``calibrate_loss_threshold`` on reference data; every sample is then scored. If
            ``None``, a seeded ``calibration_fraction`` of the members and of the non-members
            picks the threshold (Youden's J) and every number is reported on the rest.
        calibration_fraction: Share of each set used to pick the threshold, in (0, 1).
        seed: Seed of the calibration split.

    Returns:
        The attack's ``MIAResult`` (``attack="loss_threshold"``).

    Raises:
        ConfigError: on empty or mismatched data, labels out of range, a calibration split
            leaving a part empty, or ``calibration_fraction`` outside (0, 1).
    """
    member = _losses(_log_probs(model, params, members_x, members_y, "members"), members_y)
    nonmember = _losses(
        _log_probs(model, params, nonmembers_x, nonmembers_y, "non-members"), nonmembers_y
    )
    member, nonmember = member.numpy(), nonmember.numpy()
    if threshold is None:
        if not 0.0 < calibration_fraction < 1.0:
            raise ConfigError(
                f"calibration_fraction must lie in (0, 1); got {calibration_fraction}"
            )
        generator = torch_generator(derive_seed(seed, "mia_calibration"))
        cal_m, eval_m = _split(len(member), calibration_fraction, generator, "members")
        cal_n, eval_n = _split(len(nonmember), calibration_fraction, generator, "non-members")
        threshold = _youden_loss_threshold(member[cal_m.numpy()], nonmember[cal_n.numpy()])
        member, nonmember = member[eval_m.numpy()], nonmember[eval_n.numpy()]
    elif not math.isfinite(threshold):
        raise ConfigError(f"threshold must be a finite loss value; got {threshold}")
    return _summarise(
        "loss_threshold",
        -member,
        -nonmember,
        member <= threshold,
        nonmember <= threshold,
        threshold,
    )


# --- learned attacks -------------------------------------------------------------------------


def _one_thread() -> Any:
    """Return a context running scikit-learn's native thread pools on one thread.

    The attack data are small (thousands of rows, about 11 features): extra OpenMP threads only
    contend with other work, which made gradient boosting 20x slower on a busy 2-core machine.
    """
    from threadpoolctl import threadpool_limits  # a scikit-learn dependency

    return threadpool_limits(limits=1)


def _make_classifier(kind: str, seed: int) -> Any:
    """Return an unfitted scikit-learn binary classifier of the given kind."""
    if kind == "logreg":
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        return make_pipeline(
            StandardScaler(), LogisticRegression(max_iter=1000, class_weight="balanced")
        )
    from sklearn.ensemble import HistGradientBoostingClassifier

    return HistGradientBoostingClassifier(
        max_iter=100, class_weight="balanced", random_state=seed % 2**32
    )


def _reinitialised_params(model: nn.Module, seed: int) -> torch.Tensor:
    """Return fresh flat parameters: every submodule's ``reset_parameters`` under ``seed``."""
    fresh = copy.deepcopy(model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for module in fresh.modules():
            reset = getattr(module, "reset_parameters", None)
            if callable(reset):
                reset()
    return get_flat_params(fresh)


@dataclass(frozen=True, eq=False)
class ShadowAttack:
    """A fitted membership attack classifier, applicable to any parameters of ``model``.

    Build it with ``fit`` (shadow models, Shokri et al.) or ``fit_reference`` (one reference
    model, the Crab/FedADP protocol), then call ``evaluate`` once per model to judge.

    Attributes:
        model: Template module of the attacked architecture.
        spec: Features and classifier used.
        kind: ``"shadow"`` or ``"reference"``; the ``attack`` of every result.
        classifier: The fitted global scikit-learn classifier.
        class_classifiers: Fitted per-label classifiers (empty unless ``spec.per_class``).
        num_training_samples: Number of (features, in/out) rows the attack was fitted on.
    """

    model: nn.Module
    spec: AttackSpec
    kind: str
    classifier: Any
    class_classifiers: Mapping[int, Any] = field(default_factory=dict)
    num_training_samples: int = 0

    @classmethod
    def fit(
        cls,
        model: nn.Module,
        shadow_x: torch.Tensor,
        shadow_y: torch.Tensor,
        spec: ShadowSpec,
        seed: int,
    ) -> ShadowAttack:
        """Train shadow models on a held-out pool and fit the attack on their outputs.

        Steps, for each shadow i (all randomness derived from ``seed`` and i):
        1. split the pool by a seeded permutation into "in" (``spec.in_fraction``) and "out";
        2. re-initialise the template and train it on "in" with ``local_update``;
        3. label its attack features on "in" 1 and on "out" 0.
        Then fit the attack classifier on all shadows' rows (and per label, if asked).

        Args:
            model: Template module of the target architecture (not modified).
            shadow_x: Held-out inputs, disjoint from the data of any model to be judged.
            shadow_y: Their labels.
            spec: Shadow and attack hyperparameters.
            seed: Seed of splits, initialisations, batch orders and the classifier.

        Returns:
            The fitted attack (``kind="shadow"``).

        Raises:
            ConfigError: on empty or mismatched data, or a pool too small to split.
        """
        _check_xy(shadow_x, shadow_y, "shadow pool")
        features, labels, classes = [], [], []
        for i in range(spec.num_shadows):
            generator = torch_generator(derive_seed(seed, "mia_shadow", i, 0))
            inside, outside = _split(len(shadow_y), spec.in_fraction, generator, "shadow pool")
            init = _reinitialised_params(model, derive_seed(seed, "mia_shadow", i, 1))
            update = local_update(
                model,
                init,
                ClientData(shadow_x[inside], shadow_y[inside]),
                spec.training,
                seed=derive_seed(seed, "mia_shadow", i, 2),
            )
            shadow = init + update.delta
            for part, label in ((inside, 1), (outside, 0)):
                x, y = shadow_x[part], shadow_y[part]
                features.append(attack_features(model, shadow, x, y, spec.attack.top_k))
                labels.append(np.full(len(y), label, dtype=np.int64))
                classes.append(y.numpy())
        return cls._fit_classifiers(
            model,
            spec.attack,
            "shadow",
            np.concatenate(features),
            np.concatenate(labels),
            np.concatenate(classes),
            seed,
        )

    @classmethod
    def fit_reference(
        cls,
        model: nn.Module,
        params: torch.Tensor,
        members_x: torch.Tensor,
        members_y: torch.Tensor,
        nonmembers_x: torch.Tensor,
        nonmembers_y: torch.Tensor,
        spec: AttackSpec,
        seed: int,
    ) -> ShadowAttack:
        """Fit the attack on one reference model's outputs on known members and non-members.

        This is the MISR protocol of Crab (spec §4.3) and FedADP (spec §6.4): the reference is
        the model before unlearning, members are (for example) the forgotten clients' data and
        non-members half of the test set; keep the other half for ``evaluate``.

        Args:
            model: Template module (not modified).
            params: Flat parameters of the reference model.
            members_x: Inputs the reference model trained on.
            members_y: Their labels.
            nonmembers_x: Inputs it never saw.
            nonmembers_y: Their labels.
            spec: Features and classifier.
            seed: Seed of the classifier.

        Returns:
            The fitted attack (``kind="reference"``).

        Raises:
            ConfigError: on empty or mismatched data or labels out of range.
        """
        member = attack_features(model, params, members_x, members_y, spec.top_k)
        nonmember = attack_features(model, params, nonmembers_x, nonmembers_y, spec.top_k)
        return cls._fit_classifiers(
            model,
            spec,
            "reference",
            np.concatenate([member, nonmember]),
            np.concatenate([np.ones(len(member), np.int64), np.zeros(len(nonmember), np.int64)]),
            np.concatenate([members_y.numpy(), nonmembers_y.numpy()]),
            seed,
        )

    @classmethod
    def _fit_classifiers(
        cls,
        model: nn.Module,
        spec: AttackSpec,
        kind: str,
        features: np.ndarray,
        labels: np.ndarray,
        classes: np.ndarray,
        seed: int,
    ) -> ShadowAttack:
        classifier = _make_classifier(spec.classifier, derive_seed(seed, "mia_attack"))
        per_class: dict[int, Any] = {}
        with _one_thread():
            classifier.fit(features, labels)
            for c in np.unique(classes).tolist() if spec.per_class else []:
                rows = classes == c
                if min(int(labels[rows].sum()), int((1 - labels[rows]).sum())) < MIN_CLASS_SAMPLES:
                    continue  # too few rows: the global classifier answers for this label
                per_class[c] = _make_classifier(spec.classifier, derive_seed(seed, "mia_attack", c))
                per_class[c].fit(features[rows], labels[rows])
        return cls(model, spec, kind, classifier, per_class, len(labels))

    def membership_scores(
        self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor
    ) -> np.ndarray:
        """Return P(member) for each sample (x, y) under the model with flat ``params``.

        Raises:
            ConfigError: on empty or mismatched data or labels out of range.
        """
        features = attack_features(self.model, params, x, y, self.spec.top_k)
        labels = y.numpy()
        with _one_thread():
            scores = self.classifier.predict_proba(features)[:, 1]
            for c, classifier in self.class_classifiers.items():
                rows = labels == c
                if rows.any():
                    scores[rows] = classifier.predict_proba(features[rows])[:, 1]
        return scores

    def evaluate(
        self,
        params: torch.Tensor,
        target_x: torch.Tensor,
        target_y: torch.Tensor,
        nonmember_x: torch.Tensor,
        nonmember_y: torch.Tensor,
    ) -> MIAResult:
        """Attack the model with flat ``params``: member iff P(member) >= 0.5.

        Args:
            params: Flat parameters of the model to judge (original, unlearned, retrained).
            target_x: Inputs whose membership is in question (e.g. the forgotten clients' data);
                ``member_rate`` is measured on them.
            target_y: Their labels.
            nonmember_x: Inputs no judged model saw (e.g. held-out test data) for the AUC,
                precision and false-positive rate.
            nonmember_y: Their labels.

        Returns:
            The ``MIAResult`` with ``attack=self.kind`` and ``threshold=0.5``.

        Raises:
            ConfigError: on empty or mismatched data or labels out of range.
        """
        member = self.membership_scores(params, target_x, target_y)
        nonmember = self.membership_scores(params, nonmember_x, nonmember_y)
        return _summarise(self.kind, member, nonmember, member >= 0.5, nonmember >= 0.5, 0.5)
