"""``fedunlearn apply``: make an unlearning result the run's current model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from fedunlearn.cli.common import RunArg, cli_errors, parse_forget
from fedunlearn.cli.printing import console
from fedunlearn.errors import ConfigError

__all__ = ["apply", "register"]


def apply(
    run_dir: RunArg,
    result: Annotated[
        Path | None, typer.Option(help="result JSON written by 'fedunlearn unlearn --out'")
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option(help="instead of --result: a model made elsewhere (.safetensors or .pt)"),
    ] = None,
    forget: Annotated[
        str | None,
        typer.Option(help="with --model: the clients it forgot, '3,7' or 'malicious'"),
    ] = None,
    accept_non_dp: Annotated[
        bool,
        typer.Option(
            "--accept-non-dp",
            help="on a DP run: apply a model without a DP guarantee; the ledger records that "
            "the run's guarantee ended",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the event as JSON")] = False,
) -> None:
    """Make an unlearning result the run's current model; the forgotten clients leave it.

    With the method's trajectory the run's rounds are replaced by it (the original rounds'
    payloads are deleted); otherwise (and for --model) the model is appended as a new round.
    One transaction; re-run the same command after an interruption. On a DP run a model that
    is not DP is refused unless --accept-non-dp.
    """
    from fedunlearn.runs import apply_model, apply_result

    if (result is None) == (model is None) or (model is None) != (forget is None):
        raise ConfigError(
            "give --result R.json (from 'fedunlearn unlearn --out'), or --model FILE with "
            "--forget IDS"
        )
    if result is not None:
        event = apply_result(run_dir, result, accept_non_dp=accept_non_dp)
    else:
        from fedunlearn.cli.export import run_model
        from fedunlearn.experiments import read_model_file

        assert model is not None
        assert forget is not None
        ids, kind = parse_forget(forget, run_dir)
        params = read_model_file(model, run_model(run_dir))
        event = apply_model(
            run_dir,
            params,
            ids,
            method=f"external ({model.name})",
            kind=kind,
            accept_non_dp=accept_non_dp,
        )
    if as_json:
        print(json.dumps(event, indent=2))
        return
    kept = int(event.get("kept_rounds") or 0)
    if kept >= event["rounds_before"]:  # the deleted data never touched a round
        replaced = (
            f"no round replaced (rounds 1..{kept} kept: the deleted data never touched them; "
        )
    elif kept:
        replaced = (
            f"rounds {kept + 1}..{event['rounds_before']} replaced by the {event['method']} "
            f"trajectory (rounds 1..{kept} kept: the deleted data never touched them; "
        )
    else:
        replaced = (
            f"rounds 1..{event['rounds_before']} replaced by the {event['method']} trajectory ("
        )
    how = (
        f"{replaced}now rounds 1..{event['rounds_after']}; {event['dropped_payloads']} original "
        f"payloads, {event['dropped_bytes']:,} bytes, deleted)"
        if event["kind"] == "trajectory"
        else f"the {event['method']} model appended as round {event['rounds_after']} (no "
        "trajectory: methods that read earlier rounds now refuse; retrain serves)"
    )
    samples = event.get("samples") or {}
    removed = (
        f"forgotten {event['forget']} (new {event['new']})"
        if event["forget"] or not samples
        else "deleted "
        + ", ".join(f"{len(ids)} sample(s) of client {c}" for c, ids in samples.items())
    )
    console.print(
        f"generation {event['generation']}"
        + (" (applied before; nothing left to do)" if event["already_applied"] else "")
        + f": {removed}; {how}"
    )
    note = event.get("receipt")
    if note:  # what the applied result's receipt said, so a warning is seen at apply time
        flagged = ", ".join(f"{c['check']} {c['verdict'].upper()}" for c in note["flagged"])
        console.print(
            f"its receipt: influence {note['influence']}" + (f"; {flagged}" if flagged else "")
        )


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command()(cli_errors(apply))
