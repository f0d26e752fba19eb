"""The DP gate of ``fedunlearn apply``: whether an applied model is DP, and the ledger's entry.

On a DP run, ``apply`` refuses a model without a DP guarantee (every method's but the DP
releases: retrain ``dp``, fedadp ``unlearn_dp``) unless ``accept_non_dp``; whether a model is
DP, and the a-priori ε its fresh rounds add, are derived from the method, its parameters and the
run (``released_dp``, ``fedunlearn.privacy.releases``), never from the result's claim. The
ledger then records that the guarantee of the run's model ended with that generation, and keeps
the ε of DP rounds a trajectory replaced (their uploads were released):
``privacy.guarantees.living_artefacts``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedunlearn.config import RunConfig
from fedunlearn.errors import ConfigError
from fedunlearn.history.result_claims import ResultClaims
from fedunlearn.history.store import HistoryStore, RoundEntry
from fedunlearn.privacy.guarantees import applied_privacy
from fedunlearn.privacy.releases import DPRelease, method_release, release_epsilon
from fedunlearn.runs.rundir import PRIVACY_LINEAGE_KEY

__all__ = ["dp_gate", "released_dp"]


def released_dp(
    claims: ResultClaims,
    samples: Mapping[str, Any] | None,
    config: RunConfig,
    store: HistoryStore,
    forget: set[int],
) -> tuple[bool, str, float | None]:
    """Whether a result's model is DP, why, and the a-priori ε of the releases it added.

    Derived from the method, its parameters (``claims``) and the run as the store recorded it
    (``fedunlearn.privacy.releases``), never from the result's ``released_model_dp`` nor its
    ``fresh_guarantee_epsilon``: a hand-edited, re-sealed result claims what it likes (issue 40).
    ``samples``: the request's deleted samples (client -> ids).
    """
    method = claims.method or "unknown"
    release = method_release(method, claims.params, config)
    if release is None:
        return (
            False,
            (
                f"{method} with these parameters trains its fresh updates without the run's DP "
                "mechanism (derived from the method and its parameters, not the result's claim)"
            ),
            None,
        )
    fresh = release_epsilon(
        config,
        release,
        sizes=_remaining_sizes(samples, store, forget),
        rounds=_release_rounds(release, store, forget),
        clip_norm=None if config.privacy.clip_norm == "auto" else float(config.privacy.clip_norm),
    )
    if fresh is None:
        return (
            False,
            (
                f"{method}'s a-priori ε cannot be recomputed from the run (noise_mode "
                "paper_literal with clip_norm auto: its S is not stored); not counted as DP"
            ),
            None,
        )
    return True, release.reason, fresh


def _remaining_sizes(
    samples: Mapping[str, Any] | None, store: HistoryStore, forget: set[int]
) -> dict[int, int]:
    """The sample counts of the clients a result trained: every deleted sample left out."""
    sizes = store.run_meta.sizes()
    deleted = {c: len(ids) for c, ids in store.forgotten_samples().items()}
    for c, ids in (samples or {}).items():
        deleted[int(c)] = deleted.get(int(c), 0) + len(ids)
    return {c: n - deleted.get(c, 0) for c, n in sizes.items() if c not in forget}


def _release_rounds(release: DPRelease, store: HistoryStore, forget: set[int]) -> int:
    """How many fresh rounds a release can train: every round, or those a replay can read."""
    last = store.last_round() or 0
    if release.rounds == "run":
        return last
    return sum(
        1
        for t in range(1, last + 1)
        if any(r.stored and r.client_id not in forget for r in store.client_records(t))
    )


def dp_gate(
    config: RunConfig,
    store: HistoryStore,
    *,
    method: str,
    trajectory: Sequence[RoundEntry] | None,
    dp: bool,
    reason: str,
    fresh_epsilon: float | None,
    accept_non_dp: bool,
    what: str,
) -> dict[str, Any] | None:
    """On a DP run: refuse a model without a DP guarantee unless accepted; the ledger entry.

    ``train_and_store``: the run's model is DP, so any model that is not is refused unless
    accepted. ``store_only``: only the stored copies are DP (training used the clean uploads),
    so only a trajectory that is not DP is refused (it would put noise-free updates in the
    store); a model alone changes no guarantee the run had.

    Returns the store meta to merge in the apply's transaction (None on a run without DP):
    the result applied, and the ledger scalars of the DP rounds a trajectory replaces (their
    releases happened: they stay in the ledger's totals). A round the trajectory carries over
    unchanged (Crab's kept prefix: the same ``dp_*`` scalars) is not a replaced one: its row
    stays the stored round's, counted once.
    """
    cfg = config.privacy
    if not cfg.enabled:
        return None
    kind = "model" if trajectory is None else "trajectory"
    store_only = cfg.dp_scope == "store_only"
    if not dp and not accept_non_dp and (kind == "trajectory" or not store_only):
        ends = (
            "its trajectory would put noise-free updates into the store, whose copies are DP "
            "(dp_scope store_only)"
            if store_only
            else "applying it ends the DP guarantee of the run's model, of every round trained "
            "from it and, with a trajectory, of the stored history"
        )
        raise ConfigError(
            f"{what}: this run is trained with DP ({cfg.mechanism}) and the model is not DP "
            f"({reason}); {ends}. Use a DP release (retrain with dp=true, or fedadp with "
            "unlearn_dp: true), or pass "
            "--accept-non-dp (accept_non_dp=True) to apply it and record that the guarantee "
            "ended; nothing was changed"
        )
    lineage = dict(store.run_meta.privacy_lineage or {})
    generation = store.generation() + 1
    last = store.last_round() or 0
    replaced = list(lineage.get("replaced", []))
    if trajectory is not None:
        carried = {
            entry.round: {k: v for k, v in entry.scalars.items() if k.startswith("dp_")}
            for entry in trajectory
        }
        for r in range(1, last + 1):
            scalars = store.round_scalars(r)
            dp_part = {k: v for k, v in scalars.items() if k.startswith("dp_")}
            if "dp_epsilon" in dp_part and carried.get(r) != dp_part:
                replaced.append({"round": r, "replaced_by_generation": generation, **dp_part})
    applied = [
        *lineage.get("applied", []),
        applied_privacy(
            generation=generation,
            method=method,
            kind=kind,
            released_model_dp=dp,
            reason=reason,
            fresh_epsilon=fresh_epsilon if dp else None,
            round_=last + 1 if trajectory is None else len(trajectory),
        ),
    ]
    return {PRIVACY_LINEAGE_KEY: {"replaced": replaced, "applied": applied}}
