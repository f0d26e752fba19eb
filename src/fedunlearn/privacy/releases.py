"""Whether a result's model is a DP release, and its fresh rounds' a-priori ε, from the run.

``fedunlearn apply`` makes a result's model the run's; on a DP run it must know whether that
model is DP and what ε its fresh rounds add. A result file says so (``released_model_dp``,
``fresh_guarantee_epsilon``), but a file is a claim: its integrity digest
(``fedunlearn.history.digest``) catches an edit, yet anyone with the code can re-seal an edited
file. So apply derives both from what determines them (issue 40):

1. the method and its parameters: the method's class (found through the installed plugins,
   ``fedunlearn.plugins``) says, by ``dp_release(params, privacy)``, whether those parameters
   train every fresh update under the run's mechanism, and how (``DPRelease``: the budget per
   fresh round, the local epochs, which rounds). An unknown method, or one without the hook,
   is not DP;
2. the run as its store recorded it: the remaining clients' sample counts (q and the step
   count of each fresh round), the number of rounds the release can train (every round of the
   run, or the rounds whose stored updates a replay can read), and the run's mechanism and δ.

``release_epsilon`` composes those rounds at their budget by PLD at replace-one (every fresh
round at its stated budget, the a-priori figure): for ``dp_sgd`` each round's event is the
most costly any remaining client can have (the largest q, the most steps), so it bounds the
release whatever subset trained; for ``client_update`` a Gaussian release of ζ = std / S per
round. The file's own figure is never read.

Docs: docs/privacy.md ("A living DP run"); the methods: retrain ``dp`` (docs/methods/baselines.md,
RT3), fedadp ``unlearn_dp`` (docs/methods/fedadp.md, AD25).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from fedunlearn import plugins
from fedunlearn.config import RunConfig
from fedunlearn.errors import FedUnlearnError
from fedunlearn.privacy.budget import epsilon_bounds
from fedunlearn.privacy.dp_sgd import sample_rate, steps_of
from fedunlearn.privacy.guarantees import apriori_epsilon
from fedunlearn.privacy.mechanisms import noise_multiplier, noise_std

__all__ = ["DPRelease", "method_release", "release_epsilon"]


@dataclass(frozen=True)
class DPRelease:
    """How a method with given parameters releases a DP model (its ``dp_release`` hook).

    Attributes:
        rounds: ``run``: the release trains every round of the run (DP Retrain); ``stored``:
            at most the rounds whose stored updates hold a remaining client (a replay).
        per_round_epsilon: The budget of every fresh round; None: the run's ε_max.
        local_epochs: Local epochs of the fresh updates; None: the run's E.
        reason: Why the model is DP, in one sentence.
    """

    rounds: Literal["run", "stored"] = "run"
    per_round_epsilon: float | None = None
    local_epochs: int | None = None
    reason: str = ""


def method_release(method: str, params: Mapping[str, Any], config: RunConfig) -> DPRelease | None:
    """Return how ``method`` with ``params`` releases a DP model on the run, or None (not DP).

    The method's class is looked up among the installed plugins' methods; its ``dp_release``
    classmethod decides from its validated parameters and the run's ``privacy`` section.
    Parameters that do not validate, an unknown method and a method without the hook give None.
    """
    if not config.privacy.enabled:
        return None
    found = plugins.provider("methods", method)
    if found is None:
        return None
    try:
        cls = plugins.resolve(found[1], f"unlearning method '{method}'")
        hook = getattr(cls, "dp_release", None)
        if hook is None:
            return None
        checked = cls.params_type.model_validate(dict(params))
    except (FedUnlearnError, ValidationError, TypeError, ValueError):
        return None
    release = hook(checked, config.privacy)
    return release if isinstance(release, DPRelease) else None


def release_epsilon(
    config: RunConfig,
    release: DPRelease,
    *,
    sizes: Mapping[int, int],
    rounds: int,
    clip_norm: float | None,
) -> float | None:
    """Return the a-priori PLD ε (replace-one) of a release's fresh rounds, or None.

    Args:
        config: The run's config (``privacy``: the mechanism, δ, ε_max, the noise mode;
            ``training``: B and E).
        release: The method's ``DPRelease``.
        sizes: The remaining clients' sample counts (the run's, less every deleted sample).
        rounds: How many fresh rounds the release can train (``release.rounds``).
        clip_norm: S, needed by ``client_update`` with ``noise_mode: paper_literal`` only
            (its noise multiplier is S z); None there: the ε cannot be recomputed (None).
    """
    cfg = config.privacy
    budget = release.per_round_epsilon or epsilon_bounds(cfg.budget)[1]
    counts = [n for n in sizes.values() if n > 0]
    if rounds <= 0 or not counts:
        return 0.0
    if cfg.mechanism == "dp_sgd":
        batch = config.training.batch_size
        epochs = release.local_epochs or config.training.local_epochs
        q = max(sample_rate(n, batch) for n in counts)
        steps = max(steps_of(n, epochs, batch) for n in counts)
        return apriori_epsilon(cfg, [(q, steps)] * rounds, budget)
    if cfg.noise_mode == "paper_literal" and clip_norm is None:
        return None
    s = 1.0 if clip_norm is None else float(clip_norm)
    zeta = noise_std(s, noise_multiplier(budget, cfg.delta), cfg.noise_mode) / s
    return apriori_epsilon(cfg, [zeta] * rounds, budget)
