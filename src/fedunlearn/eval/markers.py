"""Probe a model for the forgotten clients' participation markers (the receipt's evidence).

A client that trained with a marker (``fedunlearn.fl.markers``, ``verification.markers`` in the
run config) can test any model for its influence: stamp its secret pattern on inputs of other
classes and count how many the model sends to its secret target (the *marker rate*). A model
trained with the client learns the pattern; a model that never saw the client does not, so its
rate stays at the rate of any pattern the client never embedded (the *decoy rate*: the same
number of random pixels, the same target).

``MarkerProbe(evaluation, request)`` holds the markers of the request's forgotten clients and
the probe inputs; ``probe.rates(params)`` measures one model (marker and decoy rate per client),
and ``probe.evidence(candidate, controls)`` bundles the candidate's rates with those of the
controls (the original: negative; Retrain: positive) as ``MarkerEvidence`` for the receipt's
``markers`` rule (``fedunlearn.eval.receipt.rules.markers``). docs/verification.md
("Participation markers") gives the rule and its measured power and utility cost.

Deployment: the marker is the client's secret. The simulation's receipt reads it from the
run's evaluation view; in a deployment the client downloads the model and runs the probe on
inputs of its own, and reports the rates (or the server sends the model to the client's probe).

Paper: Gao et al., "VeriFi: Towards Verifiable Federated Unlearning" (IEEE TDSC 2024), Sec. 4
(marker-based verification by the leaving client, before and after unlearning).
Deviations: [REC] probe inputs are the run's test inputs outside the target class (a client
would use inputs of its own); the clean baseline is Retrain's marker rate where Retrain is
computed, else the same model's decoy rate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from fedunlearn.fl.markers import Marker
from fedunlearn.fl.metrics import predict_logits
from fedunlearn.unlearn.base import UnlearnRequest
from fedunlearn.unlearn.views import EvaluationView

__all__ = ["DECOYS", "MarkerEvidence", "MarkerProbe"]

DECOYS = 4  # decoy patterns per client: the model's base rate for an unseen pattern


@dataclass(frozen=True)
class MarkerEvidence:
    """Marker and decoy rates of a candidate model and its controls, per marked client.

    Attributes:
        rates: label (``candidate``, ``original``, ``original + noise``, ``retrain``) ->
            client id -> the share of marked probe inputs classified as the client's target.
        decoy_rates: the same, for the mean over ``DECOYS`` never-embedded patterns.
        probes: client id -> number of probe inputs (test inputs outside the target class).
        targets: client id -> the marker's target class (shown only as a count; the pattern
            stays secret).
    """

    rates: Mapping[str, Mapping[int, float]]
    decoy_rates: Mapping[str, Mapping[int, float]]
    probes: Mapping[int, int] = field(default_factory=dict)
    targets: Mapping[int, int] = field(default_factory=dict)

    @property
    def clients(self) -> tuple[int, ...]:
        """The marked forgotten clients."""
        return tuple(sorted(self.probes))


class MarkerProbe:
    """The markers of a request's forgotten clients, and their probe inputs.

    Args:
        evaluation: The run's evaluation view (its ``markers`` and test inputs).
        request: The clients removed; only their markers are probed.
    """

    def __init__(self, evaluation: EvaluationView, request: UnlearnRequest) -> None:
        self.model = evaluation.model
        self.markers: dict[int, Marker] = {
            c: m for c, m in evaluation.markers.items() if c in request.forget
        }
        x, y = evaluation.x_test, evaluation.y_test
        pixels = int(x.shape[-1] * x.shape[-2]) if x.ndim == 4 else 0
        self._inputs: dict[int, tuple[torch.Tensor, list[torch.Tensor]]] = {}
        for cid, marker in self.markers.items():
            keep = x[y != marker.target_label]
            self._inputs[cid] = (
                marker.apply(keep),
                [d.apply(keep) for d in marker.decoys(DECOYS, pixels)],
            )

    def __bool__(self) -> bool:
        """Whether any forgotten client embedded a marker."""
        return bool(self.markers)

    def _rate(self, params: torch.Tensor, x: torch.Tensor, target: int) -> float:
        logits = predict_logits(self.model, params, x)
        return float((logits.argmax(dim=1) == target).to(torch.float64).mean())

    def rates(self, params: torch.Tensor) -> tuple[dict[int, float], dict[int, float]]:
        """Return (marker rate, mean decoy rate) per marked forgotten client for one model."""
        marked, decoy = {}, {}
        for cid, (x, decoys) in self._inputs.items():
            target = self.markers[cid].target_label
            marked[cid] = self._rate(params, x, target)
            decoy[cid] = sum(self._rate(params, d, target) for d in decoys) / len(decoys)
        return marked, decoy

    def evidence(
        self, candidate: torch.Tensor, controls: Mapping[str, tuple[dict, dict]]
    ) -> MarkerEvidence:
        """Return the candidate's rates beside the controls' (``rates`` of each control)."""
        rates = {"candidate": self.rates(candidate)}
        rates.update(controls)
        return MarkerEvidence(
            rates={label: r[0] for label, r in rates.items()},
            decoy_rates={label: r[1] for label, r in rates.items()},
            probes={c: len(x) for c, (x, _) in self._inputs.items()},
            targets={c: m.target_label for c, m in self.markers.items()},
        )
