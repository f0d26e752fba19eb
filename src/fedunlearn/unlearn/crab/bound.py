"""Crab's certified bound (Theorem 1) against a reference retrain, with the paper's fix noted.

One FL round is one step of size η along a pseudo-gradient -Δ/η. G is the largest observed
pseudo-gradient norm (stored, fresh and retrain steps), L the largest finite-difference ratio
||H_{τ+1} - H_τ|| / ||M_{τ+1} - M_τ|| along the reference retrain, ΔF = F(M̃_0) on R (F* >= 0),
τ_r = ceil(r T / (T' - j*)). The reference retrain (all remaining clients, T rounds from M̃_0,
the run's seeds of rounds 1..T) is a diagnostic: its cost is reported and not counted in the
method's costs.

The bound covers the calibrated replay (Stage III); final tuning rounds [CB13] are not in it.

Paper: Jiang et al., arXiv:2401.08216v2, Sec. IV-C, Theorem 1 and its proof (Appendix A,
Eqs. 24, 27).

Deviations:
    [CB15] The proof's last step sqrt(a) + sqrt(b) -> sqrt(a + b) is invalid; both the paper form
        and B_safe = sqrt(a) + sqrt(b) are reported. Only the triangle inequality (the sum of
        the two paths' step norms) is a hard check (``triangle_holds``). The constants are
        estimated in the theorem's own units (one FL round = one step of size η along -Δ/η).
        docs/methods/crab.md.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fedunlearn.errors import ConfigError
from fedunlearn.fl.engine import run_rounds
from fedunlearn.fl.records import RoundRecord
from fedunlearn.unlearn.context import UnlearnContext
from fedunlearn.unlearn.crab.params import crab_options
from fedunlearn.unlearn.crab.policy import ReferenceScorer

__all__ = ["theorem1_bounds"]


def theorem1_bounds(
    context: UnlearnContext,
    start: torch.Tensor,
    trace: list[dict[str, Any]],
    num_replayed: int,
) -> dict[str, Any]:
    """Theorem 1, B_safe and the triangle bound against a retrain from ``start``."""
    if not context.has_reference_set:
        raise ConfigError("bound_check needs the run's reference set R (UnlearnSession)")
    eta = context.clients.spec.lr
    total = context.num_rounds
    trajectory = [start]

    class _Collect:
        def on_round_end(self, record: RoundRecord) -> None:
            trajectory.append(record.global_after)

    with context.meter.diagnostic() as saved:  # the reference run is a diagnostic, not a cost
        run_rounds(
            context.clients,
            context.aggregator,
            start,
            num_rounds=total,
            participation=context.training.participation,
            observers=[_Collect()],
        )
        reference_cost = {
            "client_epochs": context.meter.costs.client_epochs - saved.client_epochs,
            "rounds": total,
        }
    steps = [trajectory[i + 1] - trajectory[i] for i in range(total)]
    step_norms = [float(s.norm()) for s in steps]
    # L: finite-difference ratio of consecutive pseudo-gradients H = -Δ/η along the retrain
    lips = [
        float((steps[i + 1] - steps[i]).norm()) / (eta * step_norms[i])
        for i in range(total - 1)
        if step_norms[i] > 0
    ]
    lip = max(lips, default=0.0)
    g_max = (
        max(
            [step_norms[i] for i in range(total)]
            + [t["max_stored_norm"] for t in trace]
            + [t["max_fresh_norm"] for t in trace]
        )
        / eta
    )
    ref = context.reference_set(crab_options(context.recording).reference_size)
    scorer = ReferenceScorer(context.clients.model, ref.x, ref.y)
    delta_f = scorer.loss(start)  # F(Mtilde_0) - F(M*) <= F(Mtilde_0)
    rows = []
    crab_path = 0.0
    sig_sq = 0.0
    for r, item in enumerate(trace, start=1):
        crab_path += item["step_norm"]
        tau = min(total, math.ceil(r * total / max(num_replayed, 1)))
        retrain_path = sum(step_norms[:tau])
        observed = float((item["params"] - trajectory[tau]).norm())
        sig_sq += item["sigma_sum"] ** 2  # Σ_{i=0}^{r-1} σcheck_i^2
        c = (lip / 2) * eta**2 * g_max**2
        # Theorem 1 as printed, and B_safe from eqs. 24 and 27
        paper = math.sqrt(eta * (delta_f * (r + tau) + c * (r * sig_sq + tau)))
        safe = math.sqrt(eta * r * (delta_f + c * sig_sq)) + math.sqrt(
            eta * tau * (delta_f + c * tau)
        )
        triangle = crab_path + retrain_path
        rows.append(
            {
                "r": r,
                "tau": tau,
                "observed": observed,
                "triangle": triangle,
                "safe": safe,
                "paper": paper,
                "observed_over_paper": observed / paper if paper > 0 else None,
                "observed_over_safe": observed / safe if safe > 0 else None,
            }
        )
    return {
        "eta": eta,
        "L": lip,
        "G": g_max,
        "delta_F": delta_f,
        "rows": rows,
        "triangle_holds": all(x["observed"] <= x["triangle"] * (1 + 1e-5) + 1e-6 for x in rows),
        "paper_holds": all(x["observed"] <= x["paper"] for x in rows),
        "safe_holds": all(x["observed"] <= x["safe"] for x in rows),
        "reference_retrain_cost": reference_cost,
    }
