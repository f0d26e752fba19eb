"""Assembly of a run config: the pieces it names by string, resolved and checked together.

``config.py`` stores names (``history.policy``, ``privacy.budget.schedule``) and a policy's
options section as given; ``resolve_config`` looks each name up in its registry, which reads the
installed plugins' declarations and imports only the plugin that provides it
(``fedunlearn.plugins``), validates ``history.<policy>`` by the policy's own options model and
checks what needs two pieces at once (``privacy.dp_scope: store_only`` needs a policy that
stores the noised copies). ``train_run`` and every config read back from a run directory pass
through it, so the stored config names every option in use.
"""

from __future__ import annotations

from fedunlearn.config import RunConfig
from fedunlearn.errors import ConfigError
from fedunlearn.history.policy import POLICIES, resolve_history
from fedunlearn.privacy.training import budget_schedule

__all__ = ["resolve_config"]


def resolve_config(config: RunConfig) -> RunConfig:
    """Return ``config`` with its named pieces checked and its policy options validated.

    A resolved config resolves to an equal one.

    Raises:
        UnknownPolicyError: ``history.policy`` names no installed policy (lists them).
        UnknownNameError: ``privacy.budget.schedule`` names no installed schedule (lists them).
        ConfigError: A ``history`` section is unknown or invalid, or ``privacy.dp_scope:
            store_only`` is combined with a policy that does not store noised copies.
    """
    history = resolve_history(config.history)
    if config.privacy.enabled:  # a typo in the schedule fails before any training; a run
        budget_schedule(config.privacy.budget)  # without DP needs no schedule (no plugin)
    if config.privacy.enabled and config.privacy.dp_scope == "store_only":
        if not POLICIES.get(history.policy).applies_store_transform:
            able = [n for n in POLICIES.names() if POLICIES.get(n).applies_store_transform]
            raise ConfigError(
                "invalid configuration: privacy.dp_scope 'store_only' noises only the stored "
                f"copies, which needs history.policy {' or '.join(repr(n) for n in able)}; "
                f"got '{history.policy}'"
            )
    return config.model_copy(update={"history": history})
