"""``fedunlearn export``: a run's model (a round's, or a result's) as safetensors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from fedunlearn.cli.common import RunArg, cli_errors, ensure_writable_output
from fedunlearn.cli.printing import console
from fedunlearn.errors import ConfigError

__all__ = ["export", "register"]


def export(
    run_dir: RunArg,
    out: Annotated[Path, typer.Option("--out", help="model file to write (*.safetensors)")],
    round_: Annotated[
        int | None,
        typer.Option("--round", help="global model after this round (default: the last)"),
    ] = None,
    result: Annotated[
        Path | None,
        typer.Option(help="result JSON of 'fedunlearn unlearn': export that model (re-run)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print what was written as JSON")] = False,
) -> None:
    """Write a run's model as safetensors (state_dict + model spec); load it with load_model."""
    from fedunlearn.cli.export import check_model_path, export_result, export_round, model_bytes

    if round_ is not None and result is not None:
        raise ConfigError("pass --round or --result, not both")
    check_model_path(out)
    ensure_writable_output(out, "file", need_bytes=model_bytes(run_dir) + 2**16)
    if result is not None:
        done = export_result(run_dir, result, out)
        what = f"{done['method']} result (forget {done['forget']})"
    else:
        done = export_round(run_dir, out, round_)
        what = f"round {done['round']}"
    if as_json:
        print(json.dumps(done, indent=2))
    else:
        console.print(
            f"{what} of {run_dir} -> {out} ({done['num_params']:,} parameters); load it with "
            f"fedunlearn.models.load_model('{out}')"
        )
        if "note" in done:
            console.print(done["note"])


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command()(cli_errors(export))
