"""``clip_norm: "auto"``: the clipping norm from the data, before any private training.

- ``client_update`` (S): the median L2 norm of the clients' unclipped updates in a short pilot
  without DP (``pilot_clip_norm``).
- ``dp_sgd`` (C): the median L2 norm of per-example gradients at the initial model M_0, on up to
  ``samples_per_client`` examples of every client (``gradient_clip_norm``); clipping at the
  median is the usual rule of thumb (Andrew et al., "Differentially Private Learning with
  Adaptive Clipping", NeurIPS 2021, target the median).

Paper: FedADP (Jiang et al.), Sec. IV-B1, does not give S (nor ε_0, ε_min, δ); the median L2
norm of the unclipped client updates of a 1-2 round no-DP pilot is our choice (deviation AD4,
docs/methods/fedadp.md).

Deviations:
    [REC] The pilot runs rounds 1..p with the run's own seeds (salt 0), so its first round's
        uploads are exactly the raw uploads of the real round 1. Neither rule is private: its
        only output, the clip norm, is data-dependent and not accounted (AD4); set a number
        to avoid it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from fedunlearn.fl.aggregators import Aggregator
from fedunlearn.fl.clients import Clients
from fedunlearn.fl.engine import run_round
from fedunlearn.fl.records import ClientData
from fedunlearn.privacy.dp_sgd import ParamLayout
from fedunlearn.privacy.per_example import check_per_example_model, per_example_clipped_sum

FALLBACK_CLIP_NORM = 1.0


def pilot_clip_norm(
    clients: Clients,
    aggregator: Aggregator,
    initial_params: torch.Tensor,
    *,
    rounds: int = 1,
    client_ids: Sequence[int] | None = None,
) -> tuple[float, list[float]]:
    """Run ``rounds`` no-DP rounds; return (median upload norm, every norm seen).

    ``client_ids``: the clients of the pilot (default: all). Falls back to S = 1 when no
    positive finite norm was observed.
    """
    params = initial_params
    norms: list[float] = []
    ids = list(clients.client_ids if client_ids is None else client_ids)
    for round_ in range(1, rounds + 1):
        record = run_round(clients, aggregator, params, round_, ids)
        norms += [float(u.delta.to(torch.float64).norm()) for u in record.updates]
        params = record.global_after
    usable = [n for n in norms if n > 0]
    return (statistics.median(usable) if usable else FALLBACK_CLIP_NORM), norms


def gradient_clip_norm(
    model: nn.Module,
    initial_params: torch.Tensor,
    client_data: Mapping[int, ClientData],
    *,
    samples_per_client: int = 64,
) -> tuple[float, list[float]]:
    """Return (median per-example gradient norm at M_0, every norm seen) for DP-SGD's C.

    Uses each client's first ``samples_per_client`` examples; falls back to C = 1 when no
    positive finite norm was observed.
    """
    check_per_example_model(model)
    layout = ParamLayout(model)
    params = layout.views(initial_params.detach().to(torch.float32))
    norms: list[float] = []
    for cid in sorted(client_data):
        data = client_data[cid]
        x, y = data.x[:samples_per_client], data.y[:samples_per_client]
        _, per_example, _ = per_example_clipped_sum(model, params, x, y, float("inf"))
        norms += [float(v) for v in per_example]
    usable = [n for n in norms if 0 < n < float("inf")]
    return (statistics.median(usable) if usable else FALLBACK_CLIP_NORM), norms
