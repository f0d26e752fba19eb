"""A run's config compared across the budget's move to its plugin (issue 38, item 4).

Runs written before the move stored FedADP's budget defaults in ``privacy.budget`` even without
DP; the same YAML read now keeps only the schedule's name. Before ``same_run_config``, resuming
such a run with its own YAML was refused ("privacy.budget.epsilon_initial: None vs 1.0").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedunlearn.config import load_config, parse_config
from fedunlearn.runs.assembly import resolve_config
from fedunlearn.runs.rundir import config_differences, same_run_config

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "digits_quickstart.yaml"
OLD_BUDGET = {
    "schedule": "fedadp",
    "epsilon_initial": 1.0,
    "epsilon_min": 1.0,
    "epsilon_max": 3.0,
    "signed_delta": False,
}


def _with(data: dict, **privacy) -> dict:
    return {**data, "privacy": {**data.get("privacy", {}), **privacy}}


@pytest.fixture
def quickstart() -> dict:
    return load_config(QUICKSTART).model_dump(mode="json")


def test_a_run_without_dp_stored_with_the_old_budget_is_the_same_run(quickstart):
    given = resolve_config(parse_config(_with(quickstart, budget={"schedule": "fedadp"}), "given"))
    stored = resolve_config(parse_config(_with(quickstart, budget=OLD_BUDGET), "stored"))

    assert stored.privacy.enabled is False
    assert same_run_config(given, stored) is True
    assert config_differences(given, stored) == ""


def test_with_dp_a_budget_option_still_makes_another_run(quickstart):
    dp = {"enabled": True, "budget": {**OLD_BUDGET, "epsilon_max": 2.0}}
    a = resolve_config(parse_config(_with(quickstart, **dp), "a"))
    b = resolve_config(parse_config(_with(quickstart, enabled=True, budget=OLD_BUDGET), "b"))

    assert same_run_config(a, b) is False
    assert config_differences(a, b) == "privacy.budget.epsilon_max: 2.0 vs 3.0"


def test_another_field_still_makes_another_run(quickstart):
    a = resolve_config(parse_config(quickstart, "a"))
    changed = {**quickstart, "seed": quickstart["seed"] + 1}
    b = resolve_config(parse_config(changed, "b"))

    assert same_run_config(a, b) is False
