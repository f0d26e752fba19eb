"""The privacy ledger of a run: per-round ε_t, σ, S and noise-to-signal, and its totals.

The ledger lives in the run's round scalars (written atomically with each round, keys below)
and is summarised into ``privacy.json`` at the end of training, by ``fedunlearn info`` and in
the ``fedadp`` results. ``privacy_summary`` rebuilds everything from the stored scalars, so a
resumed run reports exactly what an uninterrupted one does.

Paper: FedADP (Jiang et al.) Eq. 4-6; FedADP spec §3.7 (accountant and reporting).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from fedunlearn.config import PrivacyConfig
from fedunlearn.fl.metrics import CLIENTS_LOSS_KEY as LOSS_KEY
from fedunlearn.privacy.accountant import analytic_gaussian_epsilon, totals
from fedunlearn.privacy.uploads import RoundNoise

__all__ = ["LOSS_KEY", "SCALAR_KEYS", "privacy_summary", "round_scalars"]

SCALAR_KEYS = {
    "epsilon": "dp_epsilon",
    "noise_multiplier": "dp_noise_multiplier",
    "noise_std": "dp_noise_std",
    "clip_norm": "dp_clip_norm",
    "clipped_fraction": "dp_clipped_fraction",
    "raw_norm_median": "dp_raw_norm_median",
    "noise_to_signal": "dp_noise_to_signal",
}


def round_scalars(noise: RoundNoise, delta: float) -> dict[str, float]:
    """Return the round's ledger entries as round scalars (``dp_*`` keys)."""
    out = {key: float(getattr(noise, name)) for name, key in SCALAR_KEYS.items()}
    out["dp_round_epsilon_exact"] = analytic_gaussian_epsilon(noise.noise_multiplier, delta)
    return {k: (v if math.isfinite(v) else None) for k, v in out.items()}  # type: ignore[misc]


def privacy_summary(
    config: PrivacyConfig, scalars: Sequence[Mapping[str, Any]], num_params: int | None = None
) -> dict[str, Any]:
    """Summarise a run's ledger from its round scalars (``scalars[r]`` of round r, r >= 1).

    Returns:
        ``enabled``, the settings, ``rounds`` (one row per round), the effective noise
        multiplier and noise-to-signal ranges, and ``totals`` at δ for sensitivity S and 2S
        (basic, RDP, PLD, zCDP, the noisiest round's exact ε).
    """
    if not config.enabled:
        return {"enabled": False, "variant": "no DP"}
    rows = []
    for r, sc in enumerate(scalars, start=1):
        if SCALAR_KEYS["epsilon"] not in sc:
            continue
        rows.append({"round": r, **{name: sc.get(key) for name, key in SCALAR_KEYS.items()}})
        rows[-1]["round_epsilon_exact"] = sc.get("dp_round_epsilon_exact")
    zs = [float(row["noise_multiplier"]) for row in rows]
    nsr = [row["noise_to_signal"] for row in rows if row["noise_to_signal"] is not None]
    delta = config.delta
    by_factor = {
        str(f): totals([z / f for z in zs], delta, f).to_dict() if zs else None for f in (1, 2)
    }
    headline = by_factor[str(config.sens_factor)]
    clip = rows[0]["clip_norm"] if rows else None
    std = statistics.median(float(row["noise_std"]) for row in rows) if rows else None
    return {
        "enabled": True,
        "variant": "DP",
        "dp_scope": config.dp_scope,
        "protects": "uploads, model and stored history"
        if config.dp_scope == "train_and_store"
        else "stored history only (training used the clean uploads)",
        "noise_mode": config.noise_mode,
        "delta": delta,
        "sens_factor": config.sens_factor,
        "clip_norm": clip,
        "clip_norm_source": "auto (pilot)" if config.clip_norm == "auto" else "config",
        "epsilon_bounds": [config.epsilon_min, config.epsilon_max],
        "num_rounds": len(rows),
        "noise_multiplier_min": min(zs) if zs else None,
        "noise_multiplier_max": max(zs) if zs else None,
        "noise_to_signal_median": statistics.median(nsr) if nsr else None,
        "noise_norm_per_client": std * math.sqrt(num_params) if std and num_params else None,
        "total_epsilon": headline["pld_epsilon"] if headline else None,
        "totals": by_factor,
        "rounds": rows,
        "unaccounted": "the server loss driving ε_t and the stages is not privatised",
    }
