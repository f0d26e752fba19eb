"""Client-level membership evidence: the value type a receipt's client-membership check reads.

The measurement (reference models trained with and without the forgotten clients, per-example
likelihood-ratio statistics, LiRA-style) fills ``ClientMembershipEvidence``; the receipt compares
the candidate's score with the threshold and requires the negative control (the original model,
which carries the influence) to be flagged before it may say the influence is removed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GROUND_LIMIT", "ClientMembershipEvidence"]

# A model farther from every "out" reference than those lie from the run's M_0 (their training
# displacement) was not trained from M_0: the test's references say nothing about it. Measured
# on the digits quickstart: contaminated models (noise, interpolations, fine-tuned) at 0.03-0.22,
# a Retrain from another initial model at 1.9-2.0, M_0 itself at 1.0.
GROUND_LIMIT = 1.0


@dataclass(frozen=True)
class ClientMembershipEvidence:
    """Scores of several models on one client-level membership test, with its calibration.

    Args:
        scores: Test statistic per model label ("candidate", "original", "retrain", ...);
            larger means more evidence that the forgotten clients' data shaped the model.
        threshold: Decision threshold: a model scoring above it is flagged as still carrying
            the influence. Calibrated so that models trained without the clients exceed it
            with probability about ``target_fpr``.
        target_fpr: The false-positive rate the threshold was set for.
        power: Measured fraction of reference models trained *with* the clients that exceed
            the threshold (the test's power at ``target_fpr``); None when not measured.
        num_reference_models: How many reference models (with and without) were trained.
        cost_seconds: Wall time of the measurement.
        cost_client_epochs: Client epochs spent training reference models.
        notes: Free-form details for the receipt (per-client scores, sample counts).
        fitness: Each scored model's mean logit-scaled confidence on a sample of the remaining
            clients' training examples (how well trained it is, apart from the forgotten
            clients); empty when not measured.
        domain: The reference models' fitness range (low, high): the models the threshold is
            calibrated for. A model outside it is less (or more) trained than every reference,
            and its score says nothing about membership (see ``region``). None: not measured.
        in_max: The highest leave-one-out score of a reference trained *with* the clients.
        reference_toward: Each "out" reference's (independent exact retrain's) share of the
            way from Retrain to the original (``share_toward``), when Retrain was scored.
        ground: Each scored model's distance to the nearest "out" reference over the "out"
            references' mean distance from the run's M_0; above ``GROUND_LIMIT`` the model
            was not trained from M_0 (``region`` ``elsewhere``). Empty when not measured.
    """

    scores: dict[str, float]
    threshold: float
    target_fpr: float
    power: float | None
    num_reference_models: int
    cost_seconds: float
    cost_client_epochs: float
    notes: dict[str, Any] = field(default_factory=dict)
    fitness: dict[str, float] = field(default_factory=dict)
    domain: tuple[float, float] | None = None
    in_max: float | None = None
    reference_toward: tuple[float, ...] = ()
    ground: dict[str, float] = field(default_factory=dict)

    def flagged(self, label: str) -> bool:
        """Whether the model ``label`` scores above the threshold (influence detected)."""
        return self.scores[label] > self.threshold

    def region(self, label: str) -> str:
        """Where the model's fitness lies against the references' range.

        ``below``, ``within``, ``above``, ``unknown`` (not measured), ``invalid`` (the
        model's fitness is not a finite number: its outputs on the remaining clients' examples
        are NaN or infinite), or ``elsewhere`` (not trained from the run's M_0: farther from
        every reference than ``GROUND_LIMIT`` times their training displacement).
        """
        ground = self.ground.get(label)
        if ground is not None and not ground <= GROUND_LIMIT:
            return "elsewhere"
        value = self.fitness.get(label)
        if self.domain is None or value is None:
            return "unknown"
        if not math.isfinite(value):
            return "invalid"
        low, high = self.domain
        return "below" if value < low else "above" if value > high else "within"

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {
            "scores": dict(self.scores),
            "threshold": self.threshold,
            "target_fpr": self.target_fpr,
            "power": self.power,
            "num_reference_models": self.num_reference_models,
            "cost_seconds": self.cost_seconds,
            "cost_client_epochs": self.cost_client_epochs,
            "notes": dict(self.notes),
            "fitness": dict(self.fitness),
            "domain": list(self.domain) if self.domain is not None else None,
            "in_max": self.in_max,
            "reference_toward": list(self.reference_toward),
            "ground": dict(self.ground),
        }
