"""``fedunlearn verify``: check every payload, the run's consistency and its chain."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from fedunlearn.cli.common import RunArg, cli_errors
from fedunlearn.cli.printing import console, err_console

__all__ = ["register", "verify"]


def verify(
    run_dir: RunArg,
    quick: Annotated[
        bool, typer.Option(help="check the catalog and models only, not every update")
    ] = False,
    restore_config: Annotated[
        bool, typer.Option(help="first rewrite config.yaml from the store's copy")
    ] = False,
    rebuild: Annotated[
        bool,
        typer.Option(
            help="first rewrite metrics.jsonl, summary.json and privacy.json from the store"
        ),
    ] = False,
    sign: Annotated[
        Path | None,
        typer.Option(help="sign the chain head with this ed25519 private key (mode 0600)"),
    ] = None,
    sign_out: Annotated[
        Path | None,
        typer.Option(help="where --sign writes the signed head (default RUN/chain_head.json)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Check every payload, the run's consistency and its committed history; print its head.

    Exit 1 if anything is wrong (a payload removed outside 'forget' breaks the chain).
    """
    from fedunlearn.runs import check_run, rebuild_run_files
    from fedunlearn.runs import restore_config as restore

    if restore_config:
        err_console.print(f"rewrote {restore(run_dir)} from the store's copy")
    if rebuild:
        err_console.print(f"rewrote {', '.join(rebuild_run_files(run_dir))} from the store")
    result = check_run(run_dir, full=not quick)
    signed = None
    if sign is not None and result["ok"]:  # a damaged history's head is not worth a signature
        from fedunlearn.runs.chain_signing import sign_head, write_signed_head

        signed = write_signed_head(
            sign_head(run_dir, sign), sign_out or run_dir / "chain_head.json"
        )
        result["signed_head"] = str(signed)
    if as_json:
        print(json.dumps(result, indent=2))
    elif result["ok"]:
        store = result["store"]
        console.print(
            f"ok: {store['payloads_checked']} payloads ({store['bytes_checked']:,} bytes) "
            f"{'checked' if result['full'] else 'checked (quick: models only)'}; config.yaml "
            "matches the store"
        )
        chain = store.get("chain") or {}
        if chain.get("head"):
            console.print(
                f"chain: {chain['links']} links verify; head {chain['head']['head']} "
                f"(link {chain['head']['seq']})",
                highlight=False,
            )
        else:
            console.print("chain: no committed history (a run written before it)")
        if signed is not None:
            console.print(f"signed head -> {signed}", highlight=False)
    else:
        first = result["first_bad_round"]
        for problem in result["problems"]:
            sys.stderr.write(f"problem: {problem}\n")
        if first is not None:
            sys.stderr.write(
                f"first bad round: {first}. Retrain from round {max(first - 1, 0)} with: "
                f"fedunlearn train {run_dir}/config.yaml --out {run_dir} --resume --repair\n"
            )
    if not result["ok"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command()(cli_errors(verify))
