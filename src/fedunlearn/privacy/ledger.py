"""The privacy ledger of a run: per-round ε_t, σ, clip norm and noise-to-signal, and its totals.

The ledger lives in the run's round scalars (written atomically with each round, keys below)
and is summarised into ``privacy.json`` at the end of training, by ``fedunlearn info`` and in
the ``fedadp`` results. ``privacy_summary`` rebuilds everything from the stored scalars, so a
resumed run reports exactly what an uninterrupted one does.

Keys per ``privacy.mechanism``: ``SCALAR_KEYS`` (``client_update``: ε_t, ζ_t, std, S, clipped
share, median raw norm, noise-to-signal) and ``DP_SGD_SCALAR_KEYS`` (``dp_sgd``: ε_t target and
achieved by RDP and PLD, σ_t, σ_t C, C, q, steps, clipped share of the per-example gradients,
their median norm, noise-to-signal); all values are numbers (the run's config names the
mechanism). Totals: ``client_update`` composes one Gaussian event per round (RDP, PLD, zCDP,
basic, at sensitivity S and 2S); ``dp_sgd`` composes each round's ``steps``-fold
Poisson-sampled Gaussian (RDP, PLD, basic; add/remove one example only).

What each artefact's guarantee is, the a-priori bound (every round at ε_max) and the status of
every released statistic come from ``fedunlearn.privacy.guarantees`` (``artefacts``,
``epsilon_guarantee``, ``released_statistics``); ``total_epsilon`` is the realised schedule's
total, data-dependent (``schedule``).

Paper: FedADP (Jiang et al.), Sec. IV-B1, Eq. 4-6 (per-round budgets only; the totals are
deviation AD14 of docs/methods/fedadp.md). Fields: docs/privacy.md.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from fedunlearn.config import PrivacyConfig
from fedunlearn.fl.metrics import CLIENTS_LOSS_KEY as LOSS_KEY
from fedunlearn.privacy.accountant import (
    GUARANTEE_RELATION,
    SampledGaussian,
    analytic_gaussian_epsilon,
    pld_epsilon,
    sampled_totals,
    totals,
)
from fedunlearn.privacy.budget import epsilon_bounds
from fedunlearn.privacy.guarantees import (
    RELEASED_STATISTICS,
    SCHEDULE_CAVEAT,
    artefact_guarantees,
    upfront_totals,
)
from fedunlearn.privacy.local_training import RoundDPSGD
from fedunlearn.privacy.uploads import RoundNoise

__all__ = [
    "DP_SGD_SCALAR_KEYS",
    "GUARANTEES",
    "LOSS_KEY",
    "SCALAR_KEYS",
    "privacy_summary",
    "round_scalars",
]


SCALAR_KEYS = {
    "epsilon": "dp_epsilon",
    "noise_multiplier": "dp_noise_multiplier",
    "noise_std": "dp_noise_std",
    "clip_norm": "dp_clip_norm",
    "clipped_fraction": "dp_clipped_fraction",
    "raw_norm_median": "dp_raw_norm_median",
    "noise_to_signal": "dp_noise_to_signal",
}
DP_SGD_SCALAR_KEYS = {
    "epsilon": "dp_epsilon",
    "epsilon_achieved": "dp_epsilon_achieved",
    "round_epsilon_pld": "dp_round_epsilon_pld",
    "noise_multiplier": "dp_noise_multiplier",
    "noise_std": "dp_noise_std",
    "clip_norm": "dp_clip_norm",
    "sample_rate": "dp_sample_rate",
    "steps": "dp_steps",
    "clipped_fraction": "dp_clipped_fraction",
    "raw_norm_median": "dp_raw_norm_median",
    "noise_to_signal": "dp_noise_to_signal",
}
#: What each mechanism's ε protects (shown by ``fedunlearn info`` and in ``privacy.json``).
GUARANTEES = {
    "client_update": "per client and round: replace one client's data by other data of the "
    "same size (L2 sensitivity 2S: who took part and n_c are public, so adding or removing a "
    "client is visible)",
    "dp_sgd": "per example: replace one training example of one client by another (its clipped "
    "gradient and the replacement's differ by up to 2C; n_c is public, so adding or removing an "
    "example is visible); a client's whole dataset is covered only by group privacy",
}
#: Why the guarantee is stated at replace-one (``neighbour_relation``).
RELATION_REASON = (
    "every upload and client record carries the client's exact sample count n_c, and q, the "
    "step count and the FedAvg weights follow from it: adding or removing a record changes "
    "them visibly, so only replacing a record (n_c unchanged) is protected; add/remove figures "
    "(totals.add_remove_one) are what the same noise would give if n_c were hidden"
)


def round_scalars(noise: RoundNoise | RoundDPSGD, delta: float) -> dict[str, Any]:
    """Return the round's ledger entries as round scalars (``dp_*`` keys)."""
    out: dict[str, Any]
    if isinstance(noise, RoundDPSGD):
        out = {key: float(getattr(noise, name)) for name, key in DP_SGD_SCALAR_KEYS.items()}
        out[DP_SGD_SCALAR_KEYS["steps"]] = int(noise.steps)
    else:
        out = {key: float(getattr(noise, name)) for name, key in SCALAR_KEYS.items()}
        out["dp_round_epsilon_exact"] = analytic_gaussian_epsilon(noise.noise_multiplier, delta)
    return {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()
    }


def privacy_summary(
    config: PrivacyConfig,
    scalars: Sequence[Mapping[str, Any]],
    num_params: int | None = None,
    *,
    replaced: Sequence[Mapping[str, Any]] = (),
    applied: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """Summarise a run's ledger from its round scalars (``scalars[r]`` of round r, r >= 1).

    On a living run, ``replaced`` holds the ledger scalars of DP rounds an applied trajectory
    replaced in the store (each with its ``round`` and ``replaced_by_generation``): their
    releases happened, so they stay in the rows and the totals. ``applied`` holds the results
    applied to the run (``guarantees.applied_privacy``): they decide ``artefacts`` and add the
    releases of DP results to ``epsilon_guarantee.with_unlearning_releases``.

    Returns:
        ``enabled``, the mechanism and its ``guarantee`` (at ``neighbour_relation``,
        replace-one), the settings, ``rounds`` (one row per round; ``dp_sgd`` rows add
        ``round_epsilon_replace_one``), the noise multiplier and noise-to-signal ranges,
        ``epsilon_guarantee`` (the a-priori bound, the headline), ``realised_epsilon`` and
        ``totals`` at δ by relation: ``replace_one`` (the guarantee's) and ``add_remove_one``
        (what would hold with the counts hidden); ``client_update``: sensitivity 2S and S
        (basic, RDP, PLD, zCDP, the noisiest round's exact ε); ``dp_sgd``: basic, PLD, the
        costliest round's PLD ε, and RDP at ``add_remove_one`` only (dp-accounting's RDP
        accountant has no Poisson-sampled replace-one).
    """
    if not config.enabled:
        return {"enabled": False, "variant": "no DP"}
    dp_sgd = config.mechanism == "dp_sgd"
    rows = _ledger_rows(scalars, replaced, dp_sgd)
    zs = [float(row["noise_multiplier"]) for row in rows]
    nsr = [row["noise_to_signal"] for row in rows if row["noise_to_signal"] is not None]
    delta = config.delta
    by_relation = _totals_by_relation(rows, delta, dp_sgd)
    headline = by_relation[GUARANTEE_RELATION]
    clip = rows[0]["clip_norm"] if rows else None
    std = statistics.median(float(row["noise_std"]) for row in rows) if rows else None
    summary: dict[str, Any] = {
        "enabled": True,
        "variant": "DP",
        "mechanism": config.mechanism,
        "guarantee": GUARANTEES[config.mechanism],
        "dp_scope": config.dp_scope,
        "protects": "uploads, stored history and the original model (not an unlearned model: "
        "see artefacts)"
        if config.dp_scope == "train_and_store"
        else "stored history only: its updates, noised copies (training used the clean "
        "uploads, so the stored models are not DP)",
        "neighbour_relation": GUARANTEE_RELATION,
        "neighbour_relation_reason": RELATION_REASON,
        "artefacts": artefact_guarantees(config, applied, len(scalars)),
        "applied": [dict(a) for a in applied],
        "epsilon_guarantee": _with_releases(upfront_totals(config, rows), applied, config.delta),
        # the realised schedule's PLD total at the guarantee's relation: data-dependent, not
        # the guarantee (``schedule``)
        "realised_epsilon": headline["pld_epsilon"] if headline else None,
        "schedule": SCHEDULE_CAVEAT,
        "released_statistics": dict(RELEASED_STATISTICS),
        "noise_mode": config.noise_mode,
        "delta": delta,
        "sens_factor": config.sens_factor,
        "clip_norm": clip,
        "clip_norm_source": _clip_source(config),
        "epsilon_bounds": list(epsilon_bounds(config.budget)),
        "num_rounds": len(rows),
        "noise_multiplier_min": min(zs) if zs else None,
        "noise_multiplier_max": max(zs) if zs else None,
        "noise_to_signal_median": statistics.median(nsr) if nsr else None,
        "noise_norm_per_client": std * math.sqrt(num_params)
        if std and num_params and not dp_sgd
        else None,
        # = realised_epsilon, the name before issue 40 (kept for readers of older files)
        "total_epsilon": headline["pld_epsilon"] if headline else None,
        "totals": by_relation,
        "rounds": rows,
        "unaccounted": "the server loss driving ε_t and the stages is not privatised (the "
        "adaptive choice of ε_t is not covered), nor are the statistics released_statistics "
        "marks 'not private'"
        + ("; nor is the pilot that chose the clip norm" if config.clip_norm == "auto" else ""),
    }
    if dp_sgd:
        summary["sample_rate_max"] = max((row["sample_rate"] for row in rows), default=None)
        summary["steps_max"] = max((row["steps"] for row in rows), default=None)
        summary["epsilon_achieved_max"] = max(
            (row["epsilon_achieved"] for row in rows), default=None
        )
    return summary


def _ledger_rows(
    scalars: Sequence[Mapping[str, Any]], replaced: Sequence[Mapping[str, Any]], dp_sgd: bool
) -> list[dict[str, Any]]:
    """One row per DP round: the replaced (earlier) releases first, then the stored rounds."""
    keys = DP_SGD_SCALAR_KEYS if dp_sgd else SCALAR_KEYS
    rows: list[dict[str, Any]] = []
    stored = [({"round": r}, sc) for r, sc in enumerate(scalars, start=1)]
    earlier = [
        (
            {"round": int(sc["round"]), "replaced_by_generation": sc.get("replaced_by_generation")},
            sc,
        )
        for sc in replaced
    ]
    for label, sc in earlier + stored:
        if keys["epsilon"] not in sc:
            continue
        rows.append({**label, **{name: sc.get(key) for name, key in keys.items()}})
        if not dp_sgd:
            rows[-1]["round_epsilon_exact"] = sc.get("dp_round_epsilon_exact")
    return rows


def _totals_by_relation(rows: list[dict[str, Any]], delta: float, dp_sgd: bool) -> dict[str, Any]:
    """The composed totals at ``delta`` per neighbour relation (None without rows).

    ``dp_sgd`` rows get their ``round_epsilon_replace_one`` here.
    """
    if not dp_sgd:
        zs = [float(row["noise_multiplier"]) for row in rows]
        return {
            rel: totals([z / f for z in zs], delta, f).to_dict() if zs else None
            for rel, f in (("replace_one", 2), ("add_remove_one", 1))
        }
    events = [
        SampledGaussian(
            float(row["noise_multiplier"]), float(row["sample_rate"]), int(row["steps"])
        )
        for row in rows
    ]
    achieved = [float(row["epsilon_achieved"]) for row in rows]
    by_relation = {
        rel: sampled_totals(events, achieved, delta, rel).to_dict() if rows else None
        for rel in ("replace_one", "add_remove_one")
    }
    for row, event in zip(rows, events, strict=True):
        row["round_epsilon_replace_one"] = pld_epsilon(event.event(), delta, "replace_one")
    return by_relation


def _with_releases(
    upfront: dict[str, Any] | None, applied: Sequence[Mapping[str, Any]], delta: float
) -> dict[str, Any] | None:
    """Add the applied DP results' own releases to the a-priori guarantee (basic composition).

    Each DP result's fresh updates were composed on their own (PLD, ``fresh_epsilon``); across
    the run's rounds and those releases the ε add up and so do the δ (sequential composition).
    """
    fresh = [float(a["fresh_epsilon"]) for a in applied if a.get("fresh_epsilon") is not None]
    plain = [a for a in applied if not a.get("released_model_dp")]
    if upfront is not None and plain:  # the figures bound the DP releases, not the run any more
        upfront = {
            **upfront,
            "ended_at_generation": plain[0]["generation"],
            "note": f"the run's guarantee ended at generation {plain[0]['generation']} (a "
            f"{plain[0]['method']} model trained without noise was applied): these figures "
            "bound the DP releases only, not what the run has revealed",
        }
    if upfront is None or not fresh:
        return upfront
    return {
        **upfront,
        "with_unlearning_releases": {
            "epsilon": upfront["pld_epsilon"] + sum(fresh),
            "delta": delta * (1 + len(fresh)),
            "releases": len(fresh),
            "basis": "the run's rounds (a priori, PLD) plus each applied DP result's fresh "
            "releases (PLD on their own), added by sequential composition",
        },
    }


def _clip_source(config: PrivacyConfig) -> str:
    if config.clip_norm != "auto":
        return "config"
    if config.mechanism == "dp_sgd":
        return "auto (median per-example gradient norm at M_0)"
    return "auto (pilot)"
