"""Assembly of a run config: the pieces it names by string, resolved and checked together.

``fedunlearn.config`` stores names (``history.policy``, ``privacy.budget.schedule``) and their
options sections as given; ``resolve_config`` looks each name up in its registry, which reads the
installed plugins' declarations and imports only the plugin that provides it
(``fedunlearn.plugins``), validates ``history.<policy>`` and ``privacy.budget`` by the options
models the policy and the schedule declare and
checks what needs two pieces at once (``privacy.dp_scope: store_only`` needs a policy that
stores the noised copies). ``train_run`` and every config read back from a run directory pass
through it, so the stored config names every option in use.
"""

from __future__ import annotations

from fedunlearn.config import RunConfig
from fedunlearn.errors import ConfigError
from fedunlearn.history.policy import POLICIES, resolve_history
from fedunlearn.privacy.budget import resolve_budget

__all__ = ["resolve_config"]


def resolve_config(config: RunConfig) -> RunConfig:
    """Return ``config`` with its named pieces checked and its policy options validated.

    A resolved config resolves to an equal one.

    Raises:
        UnknownPolicyError: ``history.policy`` names no installed policy (lists them).
        UnknownNameError: ``privacy.budget.schedule`` names no installed schedule (lists them;
            a DP run only: a run without DP keeps ``privacy.budget`` as given, unvalidated).
        ConfigError: A ``history`` section or a ``privacy.budget`` option is unknown or
            invalid, or ``privacy.dp_scope: store_only`` is combined with a policy that does
            not store noised copies.
    """
    history = resolve_history(config.history)
    privacy = config.privacy
    # the budget's options are validated by its schedule's model (a plugin's): a typo fails
    # before any training; a run without DP needs no schedule, so no plugin: it keeps the
    # section as given, unread
    if privacy.enabled:
        privacy = privacy.model_copy(update={"budget": resolve_budget(privacy.budget)})
    if config.privacy.enabled and config.privacy.dp_scope == "store_only":
        if not POLICIES.get(history.policy).applies_store_transform:
            able = [n for n in POLICIES.names() if POLICIES.get(n).applies_store_transform]
            raise ConfigError(
                "invalid configuration: privacy.dp_scope 'store_only' noises only the stored "
                f"copies, which needs history.policy {' or '.join(repr(n) for n in able)}; "
                f"got '{history.policy}'"
            )
    return config.model_copy(update={"history": history, "privacy": privacy})
