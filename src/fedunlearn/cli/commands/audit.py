"""``fedunlearn audit``: the receipt of any model of a run's architecture."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from fedunlearn.cli.common import FinishedRunArg, cli_errors, ensure_writable_output, parse_forget
from fedunlearn.cli.options import DEFAULT_RECEIPT_FLAGS, ReceiptFlags, receipt_options
from fedunlearn.cli.receipt import RoundProgress, console, exit_code, print_verification

__all__ = ["audit", "register"]


@receipt_options()
def audit(
    run_dir: FinishedRunArg,
    model: Annotated[
        Path,
        typer.Option(help="model to audit: .safetensors (state dict) or .pt (flat or state dict)"),
    ],
    forget: Annotated[
        str | None,
        typer.Option(
            help="clients it should have forgotten: '3,7' or 'malicious' (default: "
            "those the run's store deleted)"
        ),
    ] = None,
    receipt: ReceiptFlags = DEFAULT_RECEIPT_FLAGS,
    out: Annotated[Path | None, typer.Option(help="write the receipt JSON here")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the receipt as JSON")] = False,
    result: Annotated[
        Path | None,
        typer.Option(
            help="the result JSON 'fedunlearn unlearn --out' wrote for this model: its method's "
            "warnings and lineage go into the receipt"
        ),
    ] = None,
) -> None:
    """Verify any model of a run's architecture: the receipt an unlearning result gets.

    Exit code 1 when the forgotten clients' influence remains (a check with power flags the
    model), 0 when it is removed or not shown, 2 on bad input.
    """
    from fedunlearn.experiments import audit_model
    from fedunlearn.runs.rundir import write_text_atomic

    if out is not None:
        ensure_writable_output(out, "file")
    options = receipt.options()
    ids, kind = (None, "forget") if forget is None else parse_forget(forget, run_dir)
    with RoundProgress(enabled=not as_json) as progress:
        doc = audit_model(
            run_dir,
            model,
            ids,
            kind=kind,
            receipt=options,
            progress=progress,
            result=result,
        )
    if out is not None:
        write_text_atomic(out, json.dumps(doc, indent=2) + "\n")
    verification = doc["verification"]
    if as_json:
        print(json.dumps(doc, indent=2))
    else:
        req = doc["request"]
        table = Table(show_header=False, title=f"audit of {doc['subject']}")
        m, o = doc["measures"], doc["original"]
        for key, label in (
            ("test_accuracy", "TA"),
            ("backdoor_asr", "ASR"),
            ("mia_auc", "MIA AUC (shadow)"),
            ("mia_loss_auc", "MIA AUC (loss)"),
        ):
            if m.get(key) is not None:
                table.add_row(label, f"{m[key]:.3f}", f"original {o[key]:.3f}")
        console.print(table)
        print_verification(
            verification,
            title=f"{doc['subject']} ({req['kind']} clients {req['forget']})",
            explain=receipt.explain,
        )
    if exit_code(verification):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command(name="audit")(cli_errors(audit))
