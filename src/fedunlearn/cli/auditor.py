"""``fedunlearn check-receipt``: an auditor's check of a result or receipt against its run.

One line per finding (``ok``, ``FAIL`` or ``n/a``), then exit 0 when every claim checks, 1 when
one fails (an edited figure, another model, a cut chain, a replay that differs), 2 on bad input
(``experiments.receipt_check``; what it proves: docs/verification.md, "Checking a receipt as an
auditor").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from fedunlearn.cli.common import cli_errors

__all__ = ["check_receipt_command", "register"]


def check_receipt_command(
    result: Annotated[
        Path, typer.Argument(metavar="RESULT.json", help="result of 'unlearn' or 'audit --out'")
    ],
    run_dir: Annotated[Path, typer.Option("--run", help="the finished run it names")],
    model: Annotated[
        Path | None,
        typer.Option(help="the model it speaks of (default: the result's apply file)"),
    ] = None,
    signed_head: Annotated[
        Path | None,
        typer.Option(help="a head signed with 'fedunlearn verify --sign' to find in the chain"),
    ] = None,
    public_key: Annotated[
        Path | None, typer.Option(help="the server's ed25519 public key (for --signed-head)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the findings as JSON")] = False,
) -> None:
    """Check a receipt against the run: seal, run, chain head, request, model, figures, replay.

    Exit 0 when everything checks, 1 when a claim fails, 2 on bad input.
    """
    from fedunlearn.errors import ConfigError, IntegrityError
    from fedunlearn.experiments.receipt_check import Finding, ReceiptCheck, check_receipt

    if (signed_head is None) != (public_key is None):
        raise ConfigError("--signed-head and --public-key go together")
    checked = check_receipt(result, run_dir, model=model)
    if signed_head is not None and public_key is not None:
        from fedunlearn.runs.chain_signing import check_signed_head

        try:
            doc = json.loads(signed_head.read_text())
        except (OSError, ValueError) as err:
            raise ConfigError(f"--signed-head {signed_head}: not readable JSON: {err}") from None
        try:
            statement = check_signed_head(doc, public_key, run_dir)
            found = Finding(
                "signature", True, f"the signed head (link {statement['seq']}) is in the chain"
            )
        except IntegrityError as err:
            found = Finding("signature", False, str(err))
        checked = ReceiptCheck((*checked.findings, found))
    if as_json:
        print(json.dumps(checked.to_dict(), indent=2))
    else:
        for f in checked.findings:
            mark = "ok" if f.ok else ("n/a" if f.ok is None else "FAIL")
            typer.echo(f"{mark:4} {f.name}: {f.line}")
    if not checked.ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``fedunlearn check-receipt`` to the app."""
    app.command(name="check-receipt")(cli_errors(check_receipt_command))
