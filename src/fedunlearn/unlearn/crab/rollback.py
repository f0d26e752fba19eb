"""Crab's Stage II: which stored global model recovery starts from (the rollback index j*).

The candidates are M_0 and the global models Mbar_j = M_{t_j} of the stored rounds
t_1 < ... < t_T'. Three rules (``CrabParams.rollback``):

- ``participation`` (default, [CB10]): j* is the last stored round before the first round in which
  a client of C_u was aggregated. The per-round client records (accepted, rejected, missing)
  say who was aggregated, so Mbar_{j*} is exactly free of C_u.
- ``bounded`` ([CB11], a heuristic): Eqs. 4-6 with S(C_u, j) summing, over *every* FL round
  t <= t_j, an upper bound of the forgotten clients' influence ||G_t - G_t^-|| on the FedAvg
  aggregate, computed from the per-client scalars every run records (||Δ_c||, <Δ_c, G_t>;
  ``fedunlearn.history.policy.DOT_AGGREGATE_KEY``). Φ is the paper's.
- ``paper``: Eqs. 3-6 as printed: S counts only the forgotten clients the selection stored, so
  rounds in which C_u took part unstored add nothing to it.

The S-based rules pick j* with ``rule``: ``prefix`` (default, [CB12]: the largest j such that
S(C_u, k) <= Φ(k) for every k <= j) or ``literal`` (Eq. 6: the largest j with S <= Φ).

Paper: Jiang, Shen, Liu, Tan, Lam, "Towards Efficient and Certified Recovery from Poisoning
Attacks in Federated Learning", arXiv:2401.08216v2, Sec. IV-B2, Eqs. 3-6, Alg. 2 lines 20-22.
Deviations ([Dn]): docs/methods/crab.md.

Deviations:
    [CB6] Gbar_j, the FedAvg of round t_j's stored updates, is recomputed from them; Gbar_0 = 0.
    [CB7] Φ(j) = β Σ_{k<=j} ||I_k(K_k^-)|| (the paper sums vectors); S and Φ are cumulative over
        stored rounds k <= j; I(K^-) is normalised by n_{K^-} (``influence_weights="all"``: by
        n_K); I(∅) = 0.
    [CB8] No j qualifies: j* = 0 (M_0 is always kept).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import cast

import torch

from fedunlearn.errors import UnsupportedHistoryError
from fedunlearn.history.policy import DOT_AGGREGATE_KEY
from fedunlearn.history.store import ClientRecord, HistoryReader

__all__ = [
    "first_participation",
    "forgotten_influence_bound",
    "influence",
    "participation_index",
    "require_scalars",
    "rollback_index",
    "unstored_participation",
    "weighted_mean",
]


def weighted_mean(deltas: Mapping[int, torch.Tensor], sizes: Mapping[int, int]) -> torch.Tensor:
    """Return Σ_c n_c / n_S Δ_c in float64 (FedAvg of ``deltas``; empty is an error)."""
    total = sum(sizes[c] for c in deltas)
    out = torch.zeros_like(next(iter(deltas.values())), dtype=torch.float64)
    for c in sorted(deltas):
        out += (sizes[c] / total) * deltas[c].to(torch.float64)
    return out


def influence(
    deltas: Mapping[int, torch.Tensor],
    sizes: Mapping[int, int],
    members: set[int],
    previous: torch.Tensor,
    normaliser: int | None = None,
) -> torch.Tensor:
    """Eq. 3: I(S) = Σ_{c∈S} n_c / n (Δ_c - Gbar_{j-1}); n = n_S unless given; I(∅) = 0."""
    if not members:
        return torch.zeros_like(previous)
    n = normaliser if normaliser is not None else sum(sizes[c] for c in members)
    out = torch.zeros_like(previous)
    for c in sorted(members):
        out += (sizes[c] / n) * (deltas[c].to(torch.float64) - previous)
    return out


def rollback_index(
    sensitivity: Sequence[float],
    influence_norms: Sequence[float],
    beta: float,
    rule: str = "prefix",
) -> tuple[int, list[float], list[float]]:
    """Eqs. 4-6: return (j*, cumulative S, Φ); j* = 0 if no stored round qualifies.

    Args:
        sensitivity: The per-stored-round terms of S(C_u, j) (Eq. 4).
        influence_norms: ||I_k(K_k^-)|| per stored round (the terms of Φ, Eq. 5).
        beta: β.
        rule: ``prefix`` (every k <= j satisfies S <= Φ) or ``literal`` (Eq. 6: the last j that
            does).
    """
    cum_s, phi = [], []
    s = i = 0.0
    for sk, ik in zip(sensitivity, influence_norms, strict=True):
        s += sk
        i += ik
        cum_s.append(s)
        phi.append(beta * i)
    ok = [a <= b for a, b in zip(cum_s, phi, strict=True)]
    if rule == "prefix":
        j = 0
        while j < len(ok) and ok[j]:
            j += 1
        return j, cum_s, phi
    qualifying = [j + 1 for j, good in enumerate(ok) if good]
    return (qualifying[-1] if qualifying else 0), cum_s, phi


def _aggregated(records: Iterable[ClientRecord], forget: frozenset[int]) -> list[int]:
    return sorted(r.client_id for r in records if r.status == "accepted" and r.client_id in forget)


def first_participation(
    history: HistoryReader, num_rounds: int, forget: frozenset[int]
) -> int | None:
    """Return the first round in which a client of ``forget`` was aggregated, or None.

    Rejected uploads (NaN, wrong shape) and missing clients were not aggregated.
    """
    for t in range(1, num_rounds + 1):
        if _aggregated(history.client_records(t), forget):
            return t
    return None


def participation_index(stored_rounds: Sequence[int], first: int | None) -> int:
    """[CB10] Return j* = max{j : t_j < first} (t_0 = 0); T' if C_u was never aggregated.

    Mbar_j = M_{t_j} holds round t_j's updates, so a stored round qualifies only if it
    *precedes* the first round with a forgotten client.
    """
    if first is None:
        return len(stored_rounds)
    return sum(1 for t in stored_rounds if t < first)


def unstored_participation(
    history: HistoryReader, up_to_round: int, forget: frozenset[int]
) -> dict[int, list[int]]:
    """Return round -> forgotten clients aggregated but not stored, for rounds <= ``up_to_round``.

    These are the rounds Eq. 4 (``rollback: paper``) cannot see.
    """
    out = {}
    for t in range(1, up_to_round + 1):
        ids = sorted(
            r.client_id
            for r in history.client_records(t)
            if r.status == "accepted" and r.client_id in forget and not r.stored
        )
        if ids:
            out[t] = ids
    return out


def require_scalars(records: Sequence[ClientRecord]) -> None:
    """Raise ``UnsupportedHistoryError`` unless every aggregated client has ||Δ_c|| and <Δ_c, G_t>.

    Runs recorded by an older fedunlearn lack the scalar, and ``forget()`` deletes a forgotten
    client's (they rebuild its deleted update); ``bounded`` cannot use them.
    """
    lacking = [
        r.client_id
        for r in records
        if r.status == "accepted" and (r.norm is None or DOT_AGGREGATE_KEY not in r.scalars)
    ]
    if lacking:
        raise UnsupportedHistoryError(
            f"rollback 'bounded' needs each aggregated client's norm and '{DOT_AGGREGATE_KEY}' "
            f"scalar; client(s) {lacking} have none (forget() deleted them with the client's "
            "updates, or a run recorded by an older fedunlearn). Use rollback=participation, or "
            "retrain the run."
        )


def forgotten_influence_bound(
    records: Sequence[ClientRecord],
    forget: frozenset[int],
    forgotten_mean_norm: float | None = None,
) -> float:
    """[CB11] Return an upper bound of ||G_t - G_t^-||: what removing C_u changes in a FedAvg round.

    With FedAvg weights w_c = n_c / n over the aggregated clients, W_u the forgotten clients'
    share and m_u their weighted mean, G_t - G_t^- = W_u / (1 - W_u) (m_u - G_t), and

        ||m_u - G_t||^2 = ||m_u||^2 - 2 <m_u, G_t> + ||G_t||^2,

    where <m_u, G_t> = Σ_u (w_c / W_u) <Δ_c, G_t> and ||G_t||^2 = Σ_c w_c <Δ_c, G_t> are exact
    from the recorded scalars, and ||m_u|| <= Σ_u (w_c / W_u) ||Δ_c|| (triangle inequality;
    exact for one forgotten client, or given as ``forgotten_mean_norm`` when their updates are
    stored). If every aggregated client is forgotten, the bound is ||G_t||.

    Args:
        records: The round's client records.
        forget: C_u.
        forgotten_mean_norm: ||m_u|| when known exactly (all forgotten updates stored).

    Raises:
        UnsupportedHistoryError: if an aggregated client's record lacks the norm or the scalar
            (a run recorded before these were kept).
    """
    accepted = [r for r in records if r.status == "accepted"]
    gone = [r for r in accepted if r.client_id in forget]
    if not gone:
        return 0.0
    require_scalars(accepted)
    total = sum(r.num_samples for r in accepted)
    weight = {r.client_id: r.num_samples / total for r in accepted}
    dot = {r.client_id: float(cast(float, r.scalars[DOT_AGGREGATE_KEY])) for r in accepted}
    gg = max(0.0, sum(weight[c] * dot[c] for c in weight))  # ||G_t||^2
    w_u = sum(weight[r.client_id] for r in gone)
    if w_u >= 1 - 1e-12:
        return math.sqrt(gg)
    ug = sum(weight[r.client_id] / w_u * dot[r.client_id] for r in gone)
    if forgotten_mean_norm is None:
        forgotten_mean_norm = sum(weight[r.client_id] / w_u * float(r.norm or 0.0) for r in gone)
    distance = math.sqrt(max(0.0, forgotten_mean_norm**2 - 2 * ug + gg))
    return w_u / (1 - w_u) * distance
