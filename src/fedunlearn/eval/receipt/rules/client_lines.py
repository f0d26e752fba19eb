"""The client-level test's flag lines, by where a model's fitness lies (measurement helpers).

The test's score rises with any training that makes a model more confident, not only with
membership, so the line a model faces depends on its fitness (its mean logit confidence on the
remaining clients' examples) against the references' range (``ClientMembershipEvidence.region``):

- within the range, trained more, or unmeasured: ``clean_line`` at its fitness: the calibrated
  threshold plus the growth of the clean controls' scores (``retrain*``: Retrain, Retrain
  continued 1-5 rounds) from the least fit control to the model's fitness;
- less trained than every reference: above every "with" reference and every clean, less trained
  model measured (``path_scores``: Retrain's earlier global models);
- a non-finite fitness: never (inf).
"""

from __future__ import annotations

import math

from fedunlearn.eval.mia.client import ClientMembershipEvidence

__all__ = ["clean_line", "client_line", "envelope", "path_scores"]


def path_scores(cm: ClientMembershipEvidence) -> dict[str, float]:
    """The scores of Retrain's earlier global models (clean, less trained), finite ones."""
    return {k: v for k, v in cm.scores.items() if k.startswith("clean_round_") and math.isfinite(v)}


def envelope(cm: ClientMembershipEvidence) -> list[tuple[float, float]]:
    """The clean controls' (fitness, running-max score), by fitness; ties keep the highest."""
    points = sorted(
        (cm.fitness[k], cm.scores[k])
        for k in cm.scores
        if k.startswith("retrain")
        and k in cm.fitness
        and math.isfinite(cm.scores[k])
        and math.isfinite(cm.fitness[k])
    )
    out: list[tuple[float, float]] = []
    top = -math.inf
    for f, score in points:
        top = max(top, score)
        if out and out[-1][0] == f:
            out.pop()
        out.append((f, top))
    return out


def _level(points: list[tuple[float, float]], fitness: float) -> float:
    """The envelope's level at ``fitness``: linear between points, the last segment beyond."""
    last_f, last_s = points[-1]
    if fitness >= last_f:
        slope = 0.0
        if len(points) > 1:
            prev_f, prev_s = points[-2]
            slope = max(0.0, (last_s - prev_s) / (last_f - prev_f))
        return last_s + slope * (fitness - last_f)
    for (f0, s0), (f1, s1) in zip(points, points[1:], strict=False):
        if f0 <= fitness <= f1:
            return s0 + (s1 - s0) * (fitness - f0) / (f1 - f0)
    return points[0][1]


def clean_line(cm: ClientMembershipEvidence, fitness: float | None) -> float:
    """The flag line for a model of ``fitness``: the threshold plus the clean score growth.

    Without fitness (not measured): the highest of the threshold and every clean score.
    """
    if fitness is None or not cm.fitness:
        clean = [v for k, v in cm.scores.items() if k.startswith("retrain") and math.isfinite(v)]
        return max([cm.threshold, *clean])
    points = envelope(cm)
    if not points or fitness <= points[0][0]:
        return cm.threshold
    return cm.threshold + max(0.0, _level(points, fitness) - points[0][1])


def client_line(cm: ClientMembershipEvidence, label: str) -> float:
    """The score above which the test flags ``label``, by where its fitness lies."""
    region = cm.region(label)
    if region in ("within", "above", "unknown"):
        return clean_line(cm, cm.fitness.get(label) if region != "unknown" else None)
    if region == "below" and cm.in_max is not None and math.isfinite(cm.in_max):
        return max(cm.threshold, cm.in_max, *path_scores(cm).values())
    return math.inf
