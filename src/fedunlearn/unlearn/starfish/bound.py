"""Starfish's certified-removal bound (Theorem 1) in its literal and corrected forms.

Theorem 1 (Sec. V-C) bounds the distance between Starfish's unlearned model after t_i unlearning
rounds and the retrained model after t = ceil(t_i / sigma) rounds, for an objective F that is
mu-strongly convex and L-smooth, step size eta = mu / L, both trajectories started at M_0::

    literal (Eq. 5):  ||M_hat_{t_i} - M_t|| <= 2 sqrt(eta [1/mu + 1/(sigma (mu - 2))] dF t_i)
    corrected:        ||M_hat_{t_i} - M_t|| <= 2 sqrt(eta dF [t_i / mu + t / (2 - mu)])

with dF = F(M_0) - F(M*). The corrected form redoes step 2 of the proof with the right sign,
F(M+) <= F(M) - (1 - mu/2) eta ||grad||^2, so the retraining leg is
||M_t - M_0|| <= sqrt(2 eta t dF / (2 - mu)) (valid for 0 < mu < 2); with t = t_i / sigma it is
Eq. 5 with (2 - mu) in place of (mu - 2). The literal form needs mu > 2.

This module holds the two formulas (pure math), the evaluation of both against an unlearned and a
retrained trajectory, and two helpers to get those from a run: ``retrain_trajectory`` (every
global model of a retrain, as a diagnostic whose cost is not charged) and ``regularised_loss``
(F = mean cross-entropy + l2/2 ||w||^2, so dF <= F(M_0) since F >= 0).

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Theorem 1 (Sec. V-C, Eq. 5) and its proof in App. F.

Deviations (docs/methods/starfish.md, SF23): the corrected form (the sign slip of App. F) is
what is checked, the literal form is reported (None when mu <= 2); the corrected form uses the
retrain round actually compared, t = ceil(t_i / sigma) capped at T, not t_i / sigma, so it
stays a valid upper bound when sigma does not divide t_i. The theorem assumes full-gradient
steps on F; federated rounds with local SGD epochs only approximate that, so the bound is
illustrative. dF is passed in (an upper bound such as F(M_0) keeps the bound valid).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from fedunlearn.fl.engine import run_rounds
from fedunlearn.fl.records import ClientData, RoundRecord
from fedunlearn.models.flat import set_flat_params
from fedunlearn.unlearn.context import UnlearnContext

__all__ = [
    "BoundRow",
    "Theorem1Report",
    "corrected_bound",
    "evaluate_theorem1",
    "literal_bound",
    "regularised_loss",
    "retrain_trajectory",
]


def literal_bound(
    t_i: int, *, step_size: float, mu: float, selection_rate: float, objective_gap: float
) -> float | None:
    """Eq. 5 as printed: 2 sqrt(eta [1/mu + 1/(sigma (mu - 2))] dF t_i); None if mu <= 2."""
    if mu <= 2:
        return None
    # Eq. 5 (literal; needs mu > 2)
    factor = 1.0 / mu + 1.0 / (selection_rate * (mu - 2.0))
    return 2.0 * math.sqrt(step_size * factor * objective_gap * t_i)


def corrected_bound(
    t_i: int, t: int, *, step_size: float, mu: float, objective_gap: float
) -> float | None:
    """Corrected Eq. 5: 2 sqrt(eta dF [t_i / mu + t / (2 - mu)]); None unless 0 < mu < 2.

    Args:
        t_i: Unlearning rounds done (1-based).
        t: Retrain rounds compared, ceil(t_i / sigma) (capped at T).
        step_size: eta (= eta_u = eta_l).
        mu: Strong-convexity constant of F.
        objective_gap: dF = F(M_0) - F(M*) (or an upper bound).
    """
    if not 0 < mu < 2:
        return None
    # sqrt(a) + sqrt(b) <= sqrt(2 (a + b)), a = 2 eta t_i dF / mu, b = 2 eta t dF / (2 - mu)
    return 2.0 * math.sqrt(step_size * objective_gap * (t_i / mu + t / (2.0 - mu)))


@dataclass(frozen=True)
class BoundRow:
    """Both sides of Theorem 1 after ``t_i`` unlearning rounds."""

    t_i: int
    t: int
    observed: float
    corrected: float | None
    literal: float | None


@dataclass(frozen=True)
class Theorem1Report:
    """Theorem 1 along a whole unlearning run."""

    step_size: float
    mu: float
    selection_rate: float
    objective_gap: float
    rows: tuple[BoundRow, ...]

    @property
    def corrected_holds(self) -> bool:
        """Whether the observed distance stays within the corrected bound in every row."""
        return all(r.corrected is not None and r.observed <= r.corrected for r in self.rows)

    @property
    def literal_holds(self) -> bool | None:
        """Whether the literal bound holds in every row (None if it does not apply)."""
        if any(r.literal is None for r in self.rows):
            return None
        return all(r.observed <= r.literal for r in self.rows)  # type: ignore[operator]

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {
            "step_size": self.step_size,
            "mu": self.mu,
            "selection_rate": self.selection_rate,
            "objective_gap": self.objective_gap,
            "corrected_holds": self.corrected_holds,
            "literal_holds": self.literal_holds,
            "rows": [r.__dict__ for r in self.rows],
        }


def evaluate_theorem1(
    unlearned: Sequence[torch.Tensor | Sequence[float]],
    retrained: Sequence[torch.Tensor],
    *,
    selection_rate: float,
    step_size: float,
    mu: float,
    objective_gap: float,
) -> Theorem1Report:
    """Compare ||M_hat_{t_i} - M_t|| with both bounds for t_i = 1..len(unlearned).

    Args:
        unlearned: M_hat after each unlearning round (``details.trajectory`` of a Starfish
            run with ``record_models``).
        retrained: Retrain's global models M_0..M_T (``retrain_trajectory``).
        selection_rate: sigma.
        step_size: eta.
        mu: Strong-convexity constant (the L2 coefficient for L2-regularised cross-entropy).
        objective_gap: dF = F(M_0) - F(M*), or an upper bound.
    """
    last = len(retrained) - 1
    rows = []
    for t_i, model in enumerate(unlearned, start=1):
        t = min(last, math.ceil(t_i / selection_rate - 1e-9))
        current = torch.as_tensor(model, dtype=torch.float64)
        observed = float((current - retrained[t].to(torch.float64)).norm())
        rows.append(
            BoundRow(
                t_i=t_i,
                t=t,
                observed=observed,
                corrected=corrected_bound(
                    t_i, t, step_size=step_size, mu=mu, objective_gap=objective_gap
                ),
                literal=literal_bound(
                    t_i,
                    step_size=step_size,
                    mu=mu,
                    selection_rate=selection_rate,
                    objective_gap=objective_gap,
                ),
            )
        )
    return Theorem1Report(step_size, mu, selection_rate, objective_gap, tuple(rows))


def retrain_trajectory(context: UnlearnContext) -> list[torch.Tensor]:
    """Return Retrain's global models M_0..M_T (remaining clients, the run's seeds).

    A diagnostic: the client work it costs is not left in ``context.meter``.
    """
    with context.meter.diagnostic():
        start = context.history.read_model(0)
        models = [start]

        class _Collect:
            def on_round_end(self, record: RoundRecord) -> None:
                models.append(record.global_after)

        run_rounds(
            context.clients,
            context.aggregator,
            start,
            num_rounds=context.num_rounds,
            participation=context.training.participation,
            observers=[_Collect()],
        )
    return models


def regularised_loss(
    model: nn.Module, params: torch.Tensor, datasets: Iterable[ClientData], l2: float
) -> float:
    """Return F(params) = mean cross-entropy over ``datasets`` + l2 / 2 ||params||^2.

    With SGD weight decay ``l2`` this is the objective local training descends, mu-strongly
    convex with mu = l2 for a linear model.
    """
    local = set_flat_params(copy.deepcopy(model), params)
    total, count = 0.0, 0
    with torch.no_grad():
        for data in datasets:
            total += float(F.cross_entropy(local(data.x), data.y, reduction="sum"))
            count += len(data)
    reg = 0.5 * l2 * float(params.to(torch.float64).pow(2).sum())
    return total / max(count, 1) + reg
