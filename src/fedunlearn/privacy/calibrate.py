"""``S = "auto"``: the clipping norm from a short pilot without DP.

Paper: FedADP (Jiang et al.) does not give S; FedADP spec A4 recommends the median L2 norm of
the unclipped client updates of a 1-2 round no-DP pilot, fallback S = 1 (parameter-delta units).

Deviations:
    [REC] The pilot runs rounds 1..p with the run's own seeds (salt 0), so its first round's
        uploads are exactly the raw uploads of the real round 1; it is not private (its only
        output, S, is data-dependent and not accounted; spec A4).
"""

from __future__ import annotations

import statistics

import torch

from fedunlearn.fl.aggregators import Aggregator
from fedunlearn.fl.engine import ClientTrainer, run_round

FALLBACK_CLIP_NORM = 1.0


def pilot_clip_norm(
    clients: ClientTrainer,
    aggregator: Aggregator,
    initial_params: torch.Tensor,
    *,
    rounds: int = 1,
) -> tuple[float, list[float]]:
    """Run ``rounds`` no-DP rounds; return (median upload norm, every norm seen).

    Falls back to S = 1 when no positive finite norm was observed.
    """
    params = initial_params
    norms: list[float] = []
    for round_ in range(1, rounds + 1):
        record = run_round(clients, aggregator, params, round_, list(clients.client_ids))
        norms += [float(u.delta.to(torch.float64).norm()) for u in record.updates]
        params = record.global_after
    usable = [n for n in norms if n > 0]
    return (statistics.median(usable) if usable else FALLBACK_CLIP_NORM), norms
