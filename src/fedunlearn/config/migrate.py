"""Configs written for earlier layouts, read into today's: the one place that knows them.

The pre-issue-13 layout put the budget schedule's options flat in ``privacy``
(``privacy.epsilon_max``); they are moved into ``privacy.budget`` before validation, by
``migrate`` for a whole config and ``migrate_key`` for a dotted ``--set`` override. (Configs
dumped before ``attack`` and ``training.aggregator`` were split into one model per variant list
every variant's options at their defaults; ``base.pick_variant`` drops those.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

#: The budget options that used to sit flat in ``privacy`` (FedADP's, the only schedule then).
BUDGET_KEYS = ("epsilon_initial", "epsilon_min", "epsilon_max", "signed_delta")


def migrate(data: Any) -> Any:
    """Return a run config mapping in today's layout (``data`` itself when nothing moves).

    Raises:
        ValueError: A budget option is given both flat and in ``privacy.budget``.
    """
    privacy = data.get("privacy") if isinstance(data, Mapping) else None
    moved = migrate_privacy(privacy)
    return data if moved is privacy else {**data, "privacy": moved}


def migrate_privacy(privacy: Any) -> Any:
    """Return a ``privacy`` mapping in today's layout (``privacy`` itself when nothing moves).

    ``PrivacyConfig`` validates through it, so a section built in Python may use the flat keys.

    Raises:
        ValueError: A budget option is given both flat and in ``privacy.budget``.
    """
    if not isinstance(privacy, Mapping) or not any(k in privacy for k in BUDGET_KEYS):
        return privacy
    budget = privacy.get("budget") or {}
    if isinstance(budget, BaseModel):
        budget = budget.model_dump()
    if not isinstance(budget, Mapping):
        return privacy  # validation reports the bad type
    moved, budget = dict(privacy), dict(budget)
    for key in BUDGET_KEYS:
        if key not in moved:
            continue
        if key in budget:
            raise ValueError(
                f"privacy.{key} and privacy.budget.{key} are both given; keep "
                f"privacy.budget.{key} only"
            )
        budget[key] = moved.pop(key)
    moved["budget"] = budget
    return moved


def migrate_key(path: list[str]) -> list[str]:
    """Return a dotted override's path in today's layout (``privacy.epsilon_max`` -> nested)."""
    if len(path) == 2 and path[0] == "privacy" and path[1] in BUDGET_KEYS:
        return ["privacy", "budget", path[1]]
    return path
