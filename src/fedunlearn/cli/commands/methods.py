"""``fedunlearn methods``: the registered unlearning methods and their hyperparameters."""

from __future__ import annotations

import typer

from fedunlearn.cli.common import cli_errors
from fedunlearn.cli.printing import print_table

__all__ = ["methods", "register"]


def methods() -> None:
    """List the registered unlearning methods and their hyperparameters."""
    from fedunlearn.unlearn import available_methods, get_method

    rows = []
    for name in available_methods():
        cls = get_method(name)
        fields = dict(cls.params_type.model_fields)
        execution = getattr(cls, "execution_type", None)  # e.g. Starfish's backend options
        if execution is not None:
            fields.update(execution.model_fields)
        params = ", ".join(f"{k}={v.default!r}" for k, v in fields.items()) or "-"
        policies = ", ".join(sorted(cls.required_policies)) if cls.required_policies else "any"
        rows.append([name, policies, params])
    print_table("unlearning methods", ["method", "history policies", "parameters (default)"], rows)


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command()(cli_errors(methods))
