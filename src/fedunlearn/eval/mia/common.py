"""What every membership-inference attack here shares: the result, the attack features, checks.

``MIAResult`` (AUC, accuracy, member rate, ...), ``AttackSpec`` (which features, which
classifier), ``attack_features`` (the sorted softmax vector and the loss on the true label) and
the per-sample losses the loss-threshold attack thresholds. Design notes and deviations from the
papers: ``fedunlearn.eval.mia`` (package docstring).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.fl.metrics import predict_logits

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
        if self.top_k is not None and (not is_int(self.top_k) or self.top_k < 1):
            raise ConfigError(f"AttackSpec.top_k must be None or an int >= 1; got {self.top_k!r}")
        if self.classifier not in CLASSIFIERS:
            raise ConfigError(
                f"AttackSpec.classifier must be one of {', '.join(CLASSIFIERS)}; "
                f"got {self.classifier!r}"
            )
        if not isinstance(self.per_class, bool):
            raise ConfigError(f"AttackSpec.per_class must be a bool; got {self.per_class!r}")


def is_int(value: object) -> bool:
    """Return whether ``value`` is an int (numpy ints too), not a bool."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def check_xy(x: torch.Tensor, y: torch.Tensor, what: str) -> None:
    """Raise ``ConfigError`` unless (x, y) are matching samples and labels."""
    if y.ndim != 1 or len(x) != len(y):
        raise ConfigError(
            f"{what}: need inputs (N, ...) and labels (N,); got shapes {tuple(x.shape)} and "
            f"{tuple(y.shape)}"
        )
    if len(y) == 0:
        raise ConfigError(f"{what}: no samples; pass at least one")


def model_log_probs(
    model: nn.Module, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, what: str
) -> torch.Tensor:
    """Return float64 log-softmax outputs (N, classes) after checking the labels fit them."""
    check_xy(x, y, what)
    log_probs = torch.log_softmax(predict_logits(model, params, x).to(torch.float64), dim=1)
    num_classes = log_probs.shape[1]
    if int(y.min()) < 0 or int(y.max()) >= num_classes:
        raise ConfigError(f"{what}: labels must lie in 0..{num_classes - 1} for this model")
    return log_probs


def sample_losses(log_probs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Return each sample's cross-entropy from its log-probabilities."""
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
    log_probs = model_log_probs(model, params, x, y, "attack_features")
    num_classes = log_probs.shape[1]
    if top_k is not None and top_k > num_classes:
        raise ConfigError(f"top_k {top_k} exceeds the model's {num_classes} classes")
    probs = log_probs.exp().sort(dim=1, descending=True).values[:, : top_k or num_classes]
    return torch.cat([probs, sample_losses(log_probs, y).unsqueeze(1)], dim=1).numpy()


# --- scoring ---------------------------------------------------------------------------------


def summarise(
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


def split_indices(
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
