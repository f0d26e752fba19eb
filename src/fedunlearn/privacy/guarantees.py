"""What a DP run's guarantee covers: each artefact, each released statistic, the a-priori bound.

The ledger (``fedunlearn.privacy.ledger``) reports the realised schedule: ε_t of each round as
Eq. 4 chose it from the server loss, composed. That loss is computed on the clients' data
without noise, so the realised total is data-dependent and is not by itself a DP guarantee. The
guarantee stated up front is the composition with every round at ε_max (``upfront_totals``):
whatever the loss did, no round spent more (Eq. 4 clamps ε_t to ε_max), and σ_t is at least
the σ of ε_max. It still does not cover the *choice* of ε_t (and of FedADP's stages), which
reads the non-private loss: a release of its own that no mechanism noises
(``SCHEDULE_CAVEAT``).

``artefact_guarantees`` says, per artefact (uploads, stored history, original model, unlearned
model), whether it is DP and why; ``unlearned_model_guarantee`` says so for a model an
unlearning method releases; ``RELEASED_STATISTICS`` lists every statistic a run releases besides
its models, with its status.

Paper: FedADP (Jiang et al.), Sec. IV-B1, Eq. 4-6 (per-round ε_t only). User guide:
docs/privacy.md ("What is protected, and what is not"); deviations AD14, AD23-AD25 of
docs/methods/fedadp.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from fedunlearn.config import PrivacyConfig
from fedunlearn.privacy.accountant import (
    GUARANTEE_RELATION,
    SampledGaussian,
    calibrate_sampled_gaussian,
    sampled_totals,
    totals,
)
from fedunlearn.privacy.budget import epsilon_bounds
from fedunlearn.privacy.guarantee import Guarantee, render, unit_of
from fedunlearn.privacy.local_training import RoundDPSGD

__all__ = [
    "RELEASED_STATISTICS",
    "RESULT_STATISTICS",
    "SCHEDULE_CAVEAT",
    "UPFRONT_BASIS",
    "applied_privacy",
    "apriori_epsilon",
    "artefact_claims",
    "artefact_guarantees",
    "dp_sgd_unlearning_ledger",
    "living_artefacts",
    "result_privacy",
    "unlearned_model_guarantee",
    "upfront_totals",
]

SCHEDULE_CAVEAT = (
    "ε_t is chosen by Eq. 4 from the server loss, computed on the clients' data without noise: "
    "the realised total (realised_epsilon) is data-dependent and not a DP guarantee by itself; "
    "the guarantee is epsilon_guarantee (every round at ε_max), a bound conditional on the "
    "realised schedule, which covers the noised releases but not the schedule itself (ε_t, "
    "σ_t, published to full precision) nor FedADP's stage boundaries (both read that loss)"
)
#: What ``epsilon_guarantee`` is a bound of (its ``basis``).
UPFRONT_BASIS = (
    "a priori, at replace-one: every round at ε_max (Eq. 4 clamps ε_t to it, so σ_t is at "
    "least the σ of ε_max), composed by PLD. It bounds the noised releases (uploads, models) "
    "conditional on the realised schedule: for two neighbouring datasets that lead to the same "
    "ε_1..ε_T the releases are (ε, δ)-DP. The schedule itself (ε_t, σ_t) is a noise-free "
    "function of the server loss on the clients' data, published to full precision, and is not "
    "covered; with epsilon_min = epsilon_max it is fixed and the bound is unconditional"
)

#: Every statistic a DP run releases besides its models (round metrics by name, ledger rows
#: without their ``dp_`` prefix), and what protects it.
RELEASED_STATISTICS: dict[str, str] = {
    "clients_loss": "not private: the server loss L(M_t) on the clients' data, without noise "
    "(drives ε_t and the stages)",
    "train_loss": "not released by DP training: DP clients upload no training loss (it is "
    "noise-free); a round metric of non-DP rounds only (unlearning's fresh training)",
    "epsilon": "not private: ε_t, a function of clients_loss (Eq. 4)",
    "epsilon_achieved": "not private: a function of ε_t and the public (q, steps)",
    "round_epsilon_pld": "not private: a function of ε_t and the public (q, steps)",
    "round_epsilon_exact": "not private: a function of ε_t",
    "noise_multiplier": "not private: a function of ε_t and the public (q, steps)",
    "noise_std": "not private: a function of ε_t and the clip norm",
    "clip_norm": "public when configured; not private when 'auto' (a pilot or the median "
    "per-example gradient norm at M_0)",
    "sample_rate": "public: B / n_c of the client sample counts",
    "steps": "public: ceil(E n_c / B) of the client sample counts",
    "clipped_fraction": "not private: share of clipped gradients or updates, without noise",
    "raw_norm_median": "not private: median unclipped norm, without noise",
    "noise_to_signal": "not private: uses each round's clean (noise-free) signal",
    "client_sizes": "public: the client sample counts n_c (every upload carries its own; "
    "FedAvg weights, q, steps): hence the replace-one relation (neighbour_relation)",
    "client_records": "public: who took part in a round, accepted or rejected, stored or not, "
    "with n_c; an accepted DP upload's ||Δ_c|| and <Δ_c, G_t> are post-processing of the "
    "noised uploads (not kept under store_only, whose uploads are clean); no training loss is "
    "kept; forget drops every value of the forgotten clients",
    "num_accepted": "public: how many uploads a round accepted",
    "num_rejected": "public: how many uploads a round rejected",
    "test_accuracy": "public data only (the server's test set)",
    "test_loss": "public data only (the server's test set)",
    "backdoor_asr": "public data only (the server's triggered test set)",
}


#: Every statistic an unlearning result publishes besides its model (the keys of its JSON),
#: and what protects it. None is covered by an ε: the result's figures are measured on the
#: run's data or models without noise, or on reference models no ε accounts.
RESULT_STATISTICS: dict[str, str] = {
    "round_metrics": "public data only, per unlearning round (test_accuracy, test_loss, "
    "backdoor_asr on the server's test sets); any other metric a round reports is listed here "
    "by name",
    "stored_bytes": "public: the bytes of history the method needs",
    "costs": "public: rounds, client participations and epochs, bytes read and sent (functions "
    "of the request, the run's public sample counts and the stored history's shape); "
    "wall_seconds is timing",
    "details": "not private: the method's own figures (FedADP's step ratio and cos θ share, "
    "stored fractions, participants; a DP release's ε ledger is public) read the clients' fresh "
    "updates, noise-free unless the model is a DP release, and the stored history",
    "lineage": "public: which stored rounds, updates and models the method read",
    "verification": "not private: the receipt measures the model and its reference models on "
    "the clients' data and the run's models without noise (membership AUCs on client samples, "
    "the distance to a Retrain reference, marker rates, the store's deletion evidence); a DP "
    "Retrain reference draws noise and batches of its own but is accounted in no ε",
    "retrain": "not private: the reference Retrain's test accuracy, backdoor ASR and cost; the "
    "reference is trained on the remaining clients' data and accounted in no ε",
}


def result_privacy(ledger: Mapping[str, Any], *, released_dp: bool, reason: str) -> dict[str, Any]:
    """Return a result's ``privacy`` section: the run's ledger with this result's statuses.

    One status per artefact: ``artefacts.unlearned_model`` is this result's model (``dp``,
    ``guarantee``), not the default every method starts from; ``released_statistics`` adds
    every statistic the result publishes (``RESULT_STATISTICS``). Rows are left out.
    """
    out = {k: v for k, v in ledger.items() if k != "rounds"}
    if not ledger.get("enabled"):
        return out
    out["artefacts"] = {
        **dict(ledger.get("artefacts") or {}),
        "unlearned_model": Guarantee(bool(released_dp), "stated", reason=str(reason)).to_dict(),
    }
    out["released_statistics"] = {**RELEASED_STATISTICS, **RESULT_STATISTICS}
    return out


def artefact_guarantees(
    config: PrivacyConfig,
    applied: Sequence[Mapping[str, Any]] = (),
    last_round: int | None = None,
) -> dict[str, dict[str, Any]]:
    """Return, per artefact of a run, ``{"dp": bool, "guarantee": str}``.

    Artefacts: ``uploads`` (what clients send), ``stored_history`` (the updates and models the
    store keeps), ``original_model`` (M_T) and ``unlearned_model`` (a model an unlearning
    method releases: not DP unless the method says so in its result, e.g. fedadp's
    ``details.released_model_dp``); on a living run (``applied``: the results applied to it,
    ``applied_privacy`` rows) also ``current_model``, the model the run serves and trains on.
    The decisions are ``artefact_claims``; this renders them (``Guarantee.to_dict``).
    """
    return {k: g.to_dict() for k, g in artefact_claims(config, applied, last_round).items()}


def artefact_claims(
    config: PrivacyConfig,
    applied: Sequence[Mapping[str, Any]] = (),
    last_round: int | None = None,
) -> dict[str, Guarantee]:
    """Return, per artefact of a run, the ``Guarantee`` that holds (``artefact_guarantees``)."""
    base = _artefacts(config)
    if not applied:
        return base
    return living_artefacts(config, base, applied, last_round)


def applied_privacy(
    *,
    generation: int,
    method: str,
    kind: str,
    released_model_dp: bool,
    reason: str,
    fresh_epsilon: float | None = None,
    round_: int | None = None,
) -> dict[str, Any]:
    """Return the ledger's record of one result applied to a DP run (``applied`` rows).

    Args:
        generation: The generation the apply started.
        method: The method that computed the model (or ``external``).
        kind: ``trajectory`` (its rounds replaced the run's) or ``model``.
        released_model_dp: Whether the applied model carries a DP guarantee.
        reason: Why (the result's ``released_model_reason``, or why it is unknown).
        fresh_epsilon: ε of the releases the method added (DP fresh updates), composed by PLD
            on their own, a priori (each replayed round at its largest budget); None when it
            added none or is not DP.
        round_: The round whose model the apply made current (the run's last round after it).
    """
    return {
        "generation": int(generation),
        "round": None if round_ is None else int(round_),
        "method": str(method),
        "kind": str(kind),
        "released_model_dp": bool(released_model_dp),
        "reason": str(reason),
        "fresh_epsilon": None if fresh_epsilon is None else float(fresh_epsilon),
    }


def living_artefacts(
    config: PrivacyConfig,
    base: Mapping[str, Guarantee],
    applied: Sequence[Mapping[str, Any]],
    last_round: int | None = None,
) -> dict[str, Guarantee]:
    """Each artefact's guarantee after results were applied to a DP run (docs/privacy.md).

    A model trained without noise ends the guarantee of everything computed from it: the
    model the run serves, every later round's uploads (DP-SGD noises each step, but the model
    it starts from is already a noise-free function of the clients' data) and, when its
    trajectory replaced the run's rounds, the stored history. A DP model (FedADP
    ``unlearn_dp``) keeps it, at the composition with the releases it added. Under
    ``dp_scope: store_only`` training uses the clean uploads: the current model is DP only
    while it is a DP release no round has trained from since (``last_round``).
    """
    out = dict(base)
    if not config.enabled:
        out["current_model"] = Guarantee(False, "no_dp")
        return out
    plain = [a for a in applied if not a.get("released_model_dp")]
    if config.dp_scope == "store_only":
        latest = applied[-1]
        fresh = (
            not plain  # a model released without noise ends it for good, as on train_and_store
            and latest.get("released_model_dp")
            and (last_round is None or latest.get("round") is None or last_round <= latest["round"])
        )
        if fresh:
            out["current_model"] = Guarantee(True, "release_untrained", since=latest["generation"])
        elif plain:
            out["current_model"] = Guarantee(
                False, "store_only_ended", since=plain[0]["generation"], method=plain[0]["method"]
            )
        else:
            out["current_model"] = Guarantee(False, "trained_since_release")
        out.update(_replaced_history(plain))
        return out
    if not plain:
        if any(a.get("fresh_epsilon") for a in applied):
            for name in ("uploads", "stored_history"):
                out[name] = replace(out[name], with_releases=True)
        out["current_model"] = Guarantee(True, "dp_releases")
        return out
    first = plain[0]
    g, method = first["generation"], first["method"]
    out["current_model"] = Guarantee(
        False, "ended", since=g, method=method, reason=str(first["reason"])
    )
    out["uploads"] = Guarantee(False, "ended_uploads", since=g, before=base["uploads"])
    out.update(_replaced_history(plain))
    return out


def _replaced_history(plain: Sequence[Mapping[str, Any]]) -> dict[str, Guarantee]:
    """``stored_history`` once a noise-free trajectory replaced the stored rounds (else {})."""
    replaced = [a for a in plain if a.get("kind") == "trajectory"]
    if not replaced:
        return {}
    first = replaced[0]
    return {
        "stored_history": Guarantee(
            False, "replaced_history", since=first["generation"], method=first["method"]
        )
    }


def _artefacts(config: PrivacyConfig) -> dict[str, Guarantee]:
    """The artefacts of a run as trained (nothing applied): ``artefact_claims``."""
    if not config.enabled:
        none = Guarantee(False, "no_dp")
        return {k: none for k in ("uploads", "stored_history", "original_model", "unlearned_model")}
    unit = unit_of(config)
    unlearned = Guarantee(False, "unlearning_default")
    if config.dp_scope == "store_only":
        clean = Guarantee(False, "clean_uploads")
        return {
            "uploads": clean,
            "stored_history": Guarantee(False, "noised_copies", unit=unit),
            "original_model": clean,
            "unlearned_model": unlearned,
        }
    post = Guarantee(True, "post_processing", unit=unit)
    return {
        "uploads": Guarantee(True, "mechanism", unit=unit),
        "stored_history": post,
        "original_model": post,
        "unlearned_model": unlearned,
    }


def unlearned_model_guarantee(config: PrivacyConfig, fresh_dp: bool) -> tuple[bool, str]:
    """Return (DP?, why) for a model a replay method released (fresh updates noised or not).

    Args:
        config: The run's ``privacy`` section.
        fresh_dp: Whether the method clipped and noised every fresh update it trained (and ran
            no noise-free rounds).
    """
    if not config.enabled:
        g = Guarantee(False, "run_no_dp")
    elif not fresh_dp:
        g = Guarantee(False, "fresh_noise_free")
    else:
        g = Guarantee(True, "fresh_noised", unit=unit_of(config))
    return g.dp, render(g)


def upfront_totals(
    config: PrivacyConfig, rows: Sequence[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """Return the a-priori guarantee: the run's rounds composed with every round at ε_max.

    ``dp_sgd``: each round's (q, steps) (public: client sample counts) with σ calibrated to
    ε_max; ``client_update``: each round's noise multiplier scaled to ε_max (ζ ∝ 1/ε, Eq. 6).
    Composed by PLD at the guarantee's relation (``replace_one``; RDP too for
    ``client_update``), and at ``add_remove_one`` beside it.

    Args:
        config: The run's ``privacy`` section (enabled).
        rows: The ledger rows (``privacy_summary``'s ``rounds``).

    Returns:
        ``{"neighbour_relation", "per_round_epsilon", "rounds", "delta", "pld_epsilon",
        "rdp_epsilon", "add_remove_pld_epsilon", "basis"}``, or None without rows.
    """
    if not rows:
        return None
    eps_max = epsilon_bounds(config.budget)[1]
    if config.mechanism == "dp_sgd":
        rounds: list[Any] = [(float(r["sample_rate"]), int(r["steps"])) for r in rows]
    else:  # ζ at ε_max: ζ ∝ 1/ε (Eq. 6)
        rounds = [float(r["noise_multiplier"]) * float(r["epsilon"]) / eps_max for r in rows]
    return _apriori(config, rounds, eps_max)


def _apriori(config: PrivacyConfig, rounds: Sequence[Any], per_round: float) -> dict[str, Any]:
    """The composition of ``rounds`` each at budget ``per_round`` (see ``upfront_totals``).

    ``rounds``: ``dp_sgd``: each round's accounted (q, steps); ``client_update``: each round's
    noise multiplier ζ at S (add/remove).
    """
    delta = config.delta
    if config.mechanism == "dp_sgd":
        events = [
            SampledGaussian(calibrate_sampled_gaussian(q, steps, per_round, delta), q, steps)
            for q, steps in rounds
        ]
        spent = [per_round] * len(events)
        t = sampled_totals(events, spent, delta, GUARANTEE_RELATION)
        other = sampled_totals(events, spent, delta, "add_remove_one")
    else:
        t = totals([z / 2 for z in rounds], delta, 2)
        other = totals(list(rounds), delta, 1)
    return {
        "neighbour_relation": GUARANTEE_RELATION,
        "per_round_epsilon": per_round,
        "rounds": len(rounds),
        "delta": delta,
        "pld_epsilon": t.pld_epsilon,
        "rdp_epsilon": t.rdp_epsilon,
        "add_remove_pld_epsilon": other.pld_epsilon,
        "basis": UPFRONT_BASIS,
    }


def apriori_epsilon(config: PrivacyConfig, rounds: Sequence[Any], per_round: float) -> float:
    """Return the PLD ε (``replace_one``) of ``rounds`` each at budget ``per_round``.

    The a-priori figure of a release's fresh rounds (``fedunlearn apply`` recomputes it from
    the store; ``fedunlearn.privacy.releases``). ``rounds`` as ``_apriori``'s; 0 without any.
    """
    return _apriori(config, rounds, per_round)["pld_epsilon"] if rounds else 0.0


def dp_sgd_unlearning_ledger(
    config: PrivacyConfig, ledger: Mapping[str, Any], fresh: Mapping[int, RoundDPSGD]
) -> dict[str, Any]:
    """Return the guarantee of a model replayed from DP-SGD fresh updates (FedADP ``unlearn_dp``).

    An example of a remaining client is released by every training round and by every
    replayed round it trains in; the model's total composes both (an upper bound: a client
    that does not replay a round is not released by it).

    Args:
        config: The run's ``privacy`` section (``dp_sgd``).
        ledger: The run's ledger (``privacy_summary``, with ``rounds``).
        fresh: Round -> the DP-SGD ledger row of each replayed round.

    Returns:
        ``replayed_rounds``, ``epsilon_per_round`` (the stated budget), the fresh rounds' own
        PLD total, ``total_epsilon_with_training`` (with the run's realised rounds) and
        ``guarantee_with_training`` (with the run's rounds at ε_max, a priori).
    """
    rows = list(ledger.get("rounds", []))
    delta, eps_max = config.delta, epsilon_bounds(config.budget)[1]
    train = [
        SampledGaussian(float(r["noise_multiplier"]), float(r["sample_rate"]), int(r["steps"]))
        for r in rows
    ]
    achieved = [float(r["epsilon_achieved"]) for r in rows]
    replay = [fresh[t] for t in sorted(fresh)]
    events = [r.event for r in replay]
    spent = [r.epsilon_achieved for r in replay]
    rel = GUARANTEE_RELATION
    own = sampled_totals(events, spent, delta, rel) if events else None
    realised = sampled_totals(train + events, achieved + spent, delta, rel)
    upfront_train = [
        SampledGaussian(
            calibrate_sampled_gaussian(e.sample_rate, e.steps, eps_max, delta),
            e.sample_rate,
            e.steps,
        )
        for e in train
    ]
    upfront = sampled_totals(upfront_train + events, [eps_max] * len(train) + spent, delta, rel)
    return {
        "mechanism": "dp_sgd",
        "replayed_rounds": len(replay),
        "epsilon_per_round": [r.epsilon for r in replay],
        "noise_multiplier_per_round": [r.noise_multiplier for r in replay],
        "fresh_total_epsilon": own.pld_epsilon if own else 0.0,
        # each replayed round's σ is calibrated to its stated budget (unlearn_epsilon, chosen
        # before the run), so the fresh releases' own total is a priori as well
        "fresh_guarantee_epsilon": own.pld_epsilon if own else 0.0,
        "total_epsilon_with_training": realised.pld_epsilon,
        "guarantee_with_training": upfront.pld_epsilon,
        "delta": delta,
        "neighbour_relation": rel,
        "basis": "per example, replace-one: the run's rounds and every replayed round composed "
        "by PLD; guarantee_with_training takes the run's rounds at ε_max (a priori); the choice "
        "of the replayed rounds (FedADP's stages) reads the non-private loss and is not covered",
    }
