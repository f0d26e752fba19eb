"""``fedunlearn compare``: several methods on one request, each verified; tables and plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fedunlearn.cli.common import (
    FinishedRunArg,
    ForgetOption,
    cli_errors,
    ensure_writable_output,
    parse_forget,
)
from fedunlearn.cli.options import DEFAULT_RECEIPT_FLAGS, ReceiptFlags, receipt_options
from fedunlearn.cli.printing import console, print_results
from fedunlearn.errors import ConfigError, UnknownMethodError

if TYPE_CHECKING:
    from fedunlearn.eval.plan import ReceiptOptions

__all__ = ["compare", "methods_for", "register", "run_comparison"]


@receipt_options(reference=False)
def compare(
    run_dir: FinishedRunArg,
    forget: ForgetOption,
    out: Annotated[Path, typer.Option(help="directory for results.* and plots")],
    methods_: Annotated[
        str, typer.Option("--methods", help="comma-separated methods, or 'all' (all it supports)")
    ] = "all",
    params_file: Annotated[Path | None, typer.Option(help="YAML {method: {param: value}}")] = None,
    seed: Annotated[int, typer.Option(help="seed of the evaluation attacks")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print results.json")] = False,
    receipt: ReceiptFlags = DEFAULT_RECEIPT_FLAGS,
) -> None:
    """Run several methods on a run, verify each, write results.json/csv/md and PNG plots.

    Exit code 1 when any method other than the 'none' control leaves the influence.
    """
    ensure_writable_output(out, "directory")
    params = _read_params_file(params_file)
    ids, kind = parse_forget(forget, run_dir)
    from fedunlearn.cli.receipt import comparison_exit_code, print_verdicts

    options = receipt.options(seed=seed, reference="retrain")
    doc = run_comparison(run_dir, ids, kind, methods_, params, options, quiet=as_json)
    from fedunlearn.report import plot_results, write_results

    write_results(doc, out)
    plot_results(doc, out)
    if as_json:
        print(json.dumps(doc, indent=2))
    else:
        print_results(doc)
        print_verdicts(doc, explain=receipt.explain)
        console.print(f"wrote {out}/results.json, results.csv, results.md and plots")
    if comparison_exit_code(doc):
        raise typer.Exit(1)


def _read_params_file(path: Path | None) -> dict[str, Any]:
    """Read ``--params-file``: ``{method: {param: value}}``, every method registered."""
    if path is None:
        return {}
    from fedunlearn.config import read_yaml
    from fedunlearn.unlearn import available_methods

    params = read_yaml(path, "--params-file") or {}
    if not isinstance(params, dict) or not all(isinstance(v, dict) for v in params.values()):
        raise ConfigError(
            f"--params-file {path} must map method names to parameter mappings, e.g. "
            "'federaser: {calibration_ratio: 0.5}'"
        )
    unknown = sorted(set(params) - set(available_methods()))
    if unknown:
        raise UnknownMethodError(
            f"--params-file {path} names unknown method(s) {', '.join(map(str, unknown))}; "
            f"available: {', '.join(available_methods())}"
        )
    return params


def methods_for(run_dir: Path) -> list[str]:
    """Return the methods ``--methods all`` runs on ``run_dir``.

    Every one the run's history supports (e.g. fedadp on a fedadp run); the deletion-ready ones
    only on a deletion-ready run (elsewhere each is a full Retrain).
    """
    from fedunlearn.runs import load_run_config
    from fedunlearn.unlearn import available_methods, get_method

    config = load_run_config(run_dir)
    policy = config.history.policy
    ready = config.training.sampling == "tv_stable" or config.training.shards > 1
    return [
        n
        for n in available_methods()
        if (
            get_method(n).required_policies is None
            or policy in (get_method(n).required_policies or ())
        )
        and (ready or not get_method(n).deletion_ready)
    ]


def run_comparison(
    run_dir: Path,
    ids: list[int],
    kind: str,
    methods_: str,
    params: dict[str, Any],
    options: ReceiptOptions | None = None,
    *,
    quiet: bool,
) -> dict[str, Any]:
    """Run ``compare_methods`` with progress: ``methods_`` is ``--methods`` ('all' or names)."""
    from fedunlearn.cli.receipt import RoundProgress
    from fedunlearn.experiments import compare_methods

    names = methods_for(run_dir) if methods_ == "all" else [m.strip() for m in methods_.split(",")]
    with RoundProgress(enabled=not quiet) as progress:
        return compare_methods(
            run_dir, ids, names, params=params, kind=kind, receipt=options, progress=progress
        )


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command()(cli_errors(compare))
