"""A guarantee as a value: what holds for one artefact of a run, since when, and its one sentence.

``fedunlearn.privacy.guarantees`` decides, per artefact (uploads, stored history, the original,
unlearned and current model), which statement holds: a ``Guarantee`` names it by ``kind`` with
the facts it depends on (the per-round unit, the generation it holds since, the method that
ended it, a reason given by the caller). ``render`` is the one place those decisions become
prose; ``Guarantee.to_dict()`` is the ``{"dp": bool, "guarantee": str}`` pair ``privacy.json``,
``fedunlearn info`` and results carry (their JSON is unchanged by the typing).

User guide: docs/privacy.md ("What is protected, and what is not").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from fedunlearn.config import PrivacyConfig

__all__ = ["Guarantee", "GuaranteeKind", "Unit", "render", "unit_of"]

#: The statements a guarantee can make (``render`` words each one).
GuaranteeKind = Literal[
    "no_dp",  # trained without DP
    "run_no_dp",  # a released model of a run trained without DP
    "mechanism",  # the run's mechanism noised it: (ε, δ)-DP per unit at epsilon_guarantee
    "post_processing",  # a function of the DP uploads
    "clean_uploads",  # store_only: training used the clean uploads
    "noised_copies",  # store_only: the stored updates are the noised copies
    "unlearning_default",  # the default of an unlearned model: fresh updates without noise
    "fresh_noise_free",  # a replay method's fresh updates trained without noise
    "fresh_noised",  # a replay method noised every fresh update
    "stated",  # a result's own statement (its ``reason``)
    "dp_releases",  # every applied model is a DP release
    "release_untrained",  # store_only: the applied DP release, untrained since
    "trained_since_release",  # store_only: trained on clean uploads since the DP release
    "store_only_ended",  # store_only: a noise-free applied model ended it
    "ended",  # a noise-free applied model ended the current model's guarantee
    "ended_uploads",  # uploads: DP before the generation that ended it, not after
    "replaced_history",  # a noise-free trajectory replaced the stored rounds
]

#: Who a per-round (ε, δ) protects: one training example of one client (``dp_sgd``) or one
#: client's data in a round (``client_update``).
Unit = Literal["example", "client_round"]

_UNIT_TEXT: dict[Unit, str] = {
    "example": "per training example of one client (replace-one)",
    "client_round": "per client and round (replace one client's data)",
}


def unit_of(config: PrivacyConfig) -> Unit:
    """Return who the run's per-round guarantee protects (by its mechanism)."""
    return "example" if config.mechanism == "dp_sgd" else "client_round"


@dataclass(frozen=True)
class Guarantee:
    """What holds for one artefact: DP or not, the statement (``kind``) and its facts.

    Attributes:
        dp: Whether the artefact carries a DP guarantee.
        kind: Which statement holds (``GuaranteeKind``).
        unit: Who the per-round (ε, δ) protects, where the statement names it.
        since: The generation (applied result) from which the statement holds.
        method: The method whose applied model or trajectory decided it.
        reason: A sentence given by the caller (why an applied model is DP or not; a result's
            own statement).
        with_releases: The guarantee composes the applied DP results' releases too.
        before: What held before ``since`` (``ended_uploads``: the run's own guarantee).
    """

    dp: bool
    kind: GuaranteeKind
    unit: Unit | None = None
    since: int | None = None
    method: str | None = None
    reason: str | None = None
    with_releases: bool = False
    before: Guarantee | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the ``{"dp": bool, "guarantee": str}`` pair written to JSON."""
        return {"dp": self.dp, "guarantee": render(self)}


_WITH_RELEASES = "epsilon_guarantee.with_unlearning_releases"
_FIXED: dict[str, str] = {
    "no_dp": "trained without DP",
    "run_no_dp": "the run was trained without DP; no artefact carries a DP guarantee",
    "clean_uploads": "dp_scope store_only: training used the clean uploads",
    "unlearning_default": "unlearning methods train their fresh updates without noise (Retrain, "
    "FedADP's replay and tuning; docs/methods/fedadp.md AD9, AD22); a result says "
    "otherwise in its details (fedadp: released_model_dp)",
    "fresh_noise_free": "the remaining clients' fresh updates (and any final tuning) train "
    "without noise (Alg. 2 as printed, AD9; clipped on a dp_sgd run, AD22): the unlearned model "
    "has no DP guarantee; the run's ε covers its uploads, stored history and original model",
    "dp_releases": "every applied model is DP (its method noised every fresh update): the "
    f"run's (ε, δ) composed with the applied results' releases ({_WITH_RELEASES})",
    "trained_since_release": "dp_scope store_only: training uses the clean uploads, and the "
    "current model is trained from the applied DP release since",
}


def render(g: Guarantee) -> str:
    """Return the one sentence stating ``g`` (the only place a guarantee becomes prose)."""
    if g.kind in _FIXED:
        return _FIXED[g.kind]
    unit = _UNIT_TEXT[g.unit] if g.unit is not None else ""
    if g.kind == "mechanism":
        text = (
            f"(ε, δ)-DP {unit} at epsilon_guarantee (every round at ε_max); the adaptive choice "
            "of ε_t is not covered (schedule)"
        )
    elif g.kind == "post_processing":
        text = f"post-processing of the DP uploads: the same (ε, δ) {unit}"
    elif g.kind == "noised_copies":
        text = (
            f"only its updates are DP: the stored copies are noised, (ε, δ)-DP {unit} at "
            "epsilon_guarantee; the stored global models and aggregates are training's, "
            "computed from the clean uploads (not DP), and the client records keep no norm, "
            "inner product or loss"
        )
    elif g.kind == "fresh_noised":
        text = (
            "every fresh update is clipped and noised with the run's mechanism and no "
            f"noise-free round runs: (ε, δ)-DP {unit} at the composition of the run's rounds and "
            "the replayed ones (unlearning_privacy); the adaptive ε_t and stage choices are not "
            "covered (they read the non-private loss)"
        )
    else:
        text = _since(g)
    if g.with_releases:
        text += f"; rounds after an applied DP result start from its model: {_WITH_RELEASES}"
    return text


def _since(g: Guarantee) -> str:
    """The statements about a living run: what an applied result started or ended."""
    if g.kind == "stated":
        return str(g.reason)
    if g.kind == "release_untrained":
        return f"the DP release applied in generation {g.since}, untrained since ({_WITH_RELEASES})"
    if g.kind == "store_only_ended":
        return (
            "dp_scope store_only: training uses the clean uploads, and the current model is not "
            f"DP since generation {g.since}, whose applied {g.method} model was trained without "
            "noise"
        )
    if g.kind == "ended":
        return (
            f"since generation {g.since}, whose applied {g.method} model was trained without "
            f"noise ({g.reason}); no later release restores it (the remaining clients' data was "
            "released without noise then), whether trained from that model or a DP release"
        )
    if g.kind == "ended_uploads":
        assert g.before is not None  # the run's own guarantee of its uploads
        return (
            f"rounds before generation {g.since}: {render(g.before)}; later rounds start from a "
            "model trained without noise, so their uploads are not DP although the mechanism "
            "still noises them"
        )
    if g.kind == "replaced_history":
        return (
            f"since generation {g.since}, whose {g.method} trajectory replaced the stored rounds "
            "(trained without noise); the replaced rounds' ε still counts (their uploads were "
            "released)"
        )
    raise ValueError(f"no sentence for guarantee kind {g.kind!r}")
