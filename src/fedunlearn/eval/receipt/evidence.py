"""What a receipt's rules read: one frozen value per model, composed of typed parts.

``Evidence`` is the candidate's measured row plus four parts that every receipt of a request
shares, and the per-rule measurements:

- ``Controls``: the rows of the models every statistical rule grades beside the candidate: the
  original (negative control) and the original plus small noise, Retrain (positive control),
  the clean models trained less than Retrain (its earlier global models) and more (Retrain
  continued by the remaining clients), the clean ASR of M_0 and the distances that place a
  bound or a model;
- ``Attack``: the request and the attack it concerns (who is forgotten, who attacked);
- ``Claims``: what the method says about its result (bound, warnings, lineage);
- the per-rule measurements: ``ClientMembershipEvidence``, ``MarkerEvidence``,
  ``DistanceBand`` and the store's deletion evidence.

Nothing here measures: ``fedunlearn.eval.verifier`` fills it, the rules read it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fedunlearn.eval.distance_band import DistanceBand
from fedunlearn.eval.markers import MarkerEvidence
from fedunlearn.eval.mia.client import ClientMembershipEvidence
from fedunlearn.unlearn.lineage import Lineage
from fedunlearn.unlearn.receipt import BoundReport

__all__ = ["POISONING_KINDS", "Attack", "Claims", "Controls", "Evidence", "Row", "num"]

Row = Mapping[str, Any]
# attacks whose damage is the accuracy they cost (no trigger to test)
POISONING_KINDS = ("label_flip", "trim_random", "fang_trim")


def num(value: Any) -> float | None:
    """Return ``value`` as a finite float, or None."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class Controls:
    """The models graded beside the candidate, as measured rows.

    Attributes:
        original: The original (final, not unlearned) model's row: the negative control.
        noisy: The original plus small Gaussian noise (a second negative control), or None.
        noise_std: The standard deviation of that noise.
        retrain: Retrain's row (the positive control), or None if none was computed.
        retrain_gap: ``||o - r||`` (None without Retrain).
        initial_gap: ``||M_0 - r||``: a bound at least this large says nothing.
        clean_asr: Backdoor ASR measured on the initial model M_0 (the clean reference
            without Retrain), or None.
        clean_less: Rows of Retrain's earlier global models (``clean_round_<t>``): clean models
            less trained than Retrain.
        clean_more: Rows of Retrain continued by the remaining clients
            (``retrain_continued_<k>``): clean models trained more than Retrain.
        private_reference: Whether Retrain ran under the run's DP mechanism (a DP Retrain).
        original_carries: Whether the original (the run's current model) still carries the
            forgotten clients' influence. False on a living run when every one of them was
            removed by an applied result: no influence rule has a negative control then.
    """

    original: Row
    noisy: Row | None = None
    noise_std: float | None = None
    retrain: Row | None = None
    retrain_gap: float | None = None
    initial_gap: float | None = None
    clean_asr: float | None = None
    clean_less: Mapping[str, Row] = field(default_factory=dict)
    clean_more: Mapping[str, Row] = field(default_factory=dict)
    private_reference: bool = False
    original_carries: bool = True

    def negatives(self) -> dict[str, Row]:
        """The negative controls' rows by label (the original, and with noise)."""
        out: dict[str, Row] = {"original": self.original}
        if self.noisy is not None:
            out[f"original + noise (std {self.noise_std:g})"] = self.noisy
        return out

    def values(self, rows: Mapping[str, Row], key: str) -> dict[str, float]:
        """The finite ``key`` values of ``rows`` (e.g. ``clean_less``), by label."""
        found = {label: num(row.get(key)) for label, row in rows.items()}
        return {label: v for label, v in found.items() if v is not None}


@dataclass(frozen=True)
class Attack:
    """The request and the attack it is about.

    Attributes:
        request_kind: ``forget`` (deletion request) or ``recover`` (poisoning).
        clients: The forgotten client ids (empty: unknown).
        backdoor: Whether the run has a backdoor attack.
        kind: The run's attack (``backdoor``, ``label_flip``, ...; None: no attack).
        attackers_forgotten: How many of the run's attacking clients the request removes.
        clients_forgotten: How many clients the request removes whose influence the current
            model carries (0: unknown, taken as every one an attacker).
        attackers_total: How many attacking clients the run has.
        private_run: Whether the run was trained with DP.
    """

    request_kind: str = "forget"
    clients: tuple[int, ...] = ()
    backdoor: bool = False
    kind: str | None = None
    attackers_forgotten: int = 0
    clients_forgotten: int = 0
    attackers_total: int = 0
    private_run: bool = False

    @property
    def honest_forgotten(self) -> int:
        """Forgotten clients that did not attack (0 when unknown)."""
        return max(0, self.clients_forgotten - self.attackers_forgotten)

    @property
    def attackers_remain(self) -> bool:
        """Whether attacking clients stay in the federation."""
        return self.attackers_forgotten < self.attackers_total

    @property
    def poisoning(self) -> bool:
        """Whether a forgotten client ran a non-backdoor poisoning attack."""
        return self.kind in POISONING_KINDS and self.attackers_forgotten > 0


@dataclass(frozen=True)
class Claims:
    """What the method says about its result.

    Attributes:
        bound: The method's certified bound, if it provides one.
        warnings: The method's own warnings (``details.warnings``).
        warnings_available: False when they were not available (a model audited without its
            result file).
        lineage: The result's lineage, or None when none was available.
        assumptions: What the result rests on (``details.assumptions``: e.g. a threat model);
            carried into the receipt verbatim, judged by no rule.
    """

    bound: BoundReport | None = None
    warnings: tuple[str, ...] = ()
    warnings_available: bool = True
    lineage: Lineage | None = None
    assumptions: tuple[str, ...] = ()


@dataclass(frozen=True)
class Evidence:
    """What was measured about one model and its references, for the rules.

    Attributes:
        row: The judged model's row (``Judge``: ``test_accuracy``, ``backdoor_asr``,
            ``mia_auc``, ``mia_loss_auc``, ``distance_to_retrain``, ``distance_to_original``,
            ``toward_original``, with sample sizes).
        controls: The control models' rows.
        attack: The request and its attack.
        claims: The method's claims.
        client_membership: The client-level test's scores (``candidate`` is the judged model),
            or None when it was not run.
        markers: The participation-marker rates of the model and its controls, or None.
        distance_band: The spread of independent exact retrains around Retrain, or None.
        deletion: The store's deletion evidence, or None when the store was not read.
    """

    row: Row
    controls: Controls
    attack: Attack = field(default_factory=Attack)
    claims: Claims = field(default_factory=Claims)
    client_membership: ClientMembershipEvidence | None = None
    markers: MarkerEvidence | None = None
    distance_band: DistanceBand | None = None
    deletion: Mapping[str, Any] | None = None

    @property
    def clients_text(self) -> str:
        """The forgotten clients in words."""
        ids = self.attack.clients or tuple((self.deletion or {}).get("clients") or ())
        if ids:
            return "client(s) " + ", ".join(str(c) for c in ids)
        return "the forgotten clients"
