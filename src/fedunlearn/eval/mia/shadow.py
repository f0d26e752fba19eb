"""The shadow-model attack (Shokri et al., IEEE S&P 2017, §IV) and its reference variant.

Shadow models of the target's architecture train on random halves of a held-out pool; an attack
classifier learns to tell their outputs on the "in" half from those on the "out" half and is then
applied to the target model's outputs. ``ShadowAttack.fit_reference`` is the variant of the Crab
and FedADP papers: the attack is fitted on one reference model's outputs on known members and
non-members.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.eval.mia.common import (
    MAX_SHADOWS,
    MIN_CLASS_SAMPLES,
    AttackSpec,
    MIAResult,
    attack_features,
    check_xy,
    is_int,
    split_indices,
    summarise,
)
from fedunlearn.fl.client import LocalTrainingSpec, local_update
from fedunlearn.fl.records import ClientData
from fedunlearn.fl.seeding import derive_seed, torch_generator
from fedunlearn.models.flat import get_flat_params


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
        if not is_int(self.num_shadows) or not 1 <= self.num_shadows <= MAX_SHADOWS:
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
        check_xy(shadow_x, shadow_y, "shadow pool")
        features, labels, classes = [], [], []
        for i in range(spec.num_shadows):
            generator = torch_generator(derive_seed(seed, "mia_shadow", i, 0))
            inside, outside = split_indices(
                len(shadow_y), spec.in_fraction, generator, "shadow pool"
            )
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
        return summarise(self.kind, member, nonmember, member >= 0.5, nonmember >= 0.5, 0.5)
