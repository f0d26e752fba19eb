"""The ``fedunlearn`` command: train, info, verify, forget, unlearn, apply, compare, audit, ....

This module only assembles the typer app: the root options (``--version``, ``--debug``,
``--threads``) and each command's module (``cli.commands.<command>``, its ``register(app)``),
then every installed plugin's commands. Commands only parse arguments, call library functions
and print; the library never imports this.
Every user-facing failure is one line on stderr naming the path or field and what to do, with
exit code 1 for a damaged store and 2 otherwise, never 1 by accident (``cli.common.cli_errors``;
``fedunlearn --debug <command>`` shows the traceback; docs/faults.md). Outputs are checked
writable, with room for a model, before any work (``cli.common.ensure_writable_output``). torch, the
methods and the reports are imported inside the commands that use them, so ``fedunlearn --help``
and ``--version`` answer without loading them.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Annotated

import typer

from fedunlearn import __version__
from fedunlearn.cli.commands import COMMANDS
from fedunlearn.cli.commands.compare import methods_for
from fedunlearn.cli.common import install_warning_format, set_debug
from fedunlearn.cli.threads import MAX_THREADS, apply_threads

__all__ = ["app", "main", "methods_for"]

app = typer.Typer(
    help="Federated unlearning and recovery from poisoning.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"fedunlearn {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_show_version, help="print the version and exit"
        ),
    ] = False,
    debug: Annotated[
        bool, typer.Option("--debug", help="on an error, show the full traceback")
    ] = False,
    threads: Annotated[
        int | None,
        typer.Option(
            "--threads",
            min=1,
            max=MAX_THREADS,
            help="torch intra-op threads for new runs (default: torch's, capped at the CPUs "
            "this process gets); a run keeps the count it was trained with",
        ),
    ] = None,
) -> None:
    """Federated unlearning and recovery from poisoning."""
    set_debug(ctx, debug)
    apply_threads(ctx, threads)


def _register_commands() -> None:
    from fedunlearn.cli import auditor, plan
    from fedunlearn.cli.central import central_command
    from fedunlearn.plugins import cli_hooks

    for name in COMMANDS:
        importlib.import_module(f"fedunlearn.cli.commands.{name}").register(app)
    plan.register(app)  # plan
    auditor.register(app)  # check-receipt
    app.command(name="central")(central_command)  # wrapped by cli_errors where defined
    for register in cli_hooks():  # each installed plugin's commands (Plugin.cli)
        register(app)


_register_commands()


def main() -> None:  # pragma: no cover - console entry point
    """Run the CLI."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    install_warning_format()
    app(prog_name="fedunlearn")


if __name__ == "__main__":  # pragma: no cover
    main()
    sys.exit(0)
