"""``fedunlearn demo``: train on digits with backdoored clients, compare every method."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fedunlearn.cli.commands.compare import run_comparison
from fedunlearn.cli.commands.train import print_summary, run_training
from fedunlearn.cli.common import ExplainOption, cli_errors, ensure_writable_output, fail
from fedunlearn.cli.printing import console, err_console, print_results

if TYPE_CHECKING:
    from fedunlearn.config import RunConfig

__all__ = ["DEMO_CONFIG", "demo", "register"]

DEMO_CONFIG: dict[str, Any] = {
    "seed": 0,
    "data": {"dataset": "digits", "num_clients": 10, "partition": "iid"},
    "model": {"name": "mlp", "hidden": [64]},
    "training": {"rounds": 30, "local_epochs": 2, "lr": 0.1, "batch_size": 32},
    "attack": {"kind": "backdoor", "num_malicious": 2, "target_label": 0, "trigger_size": 3},
    "history": {"policy": "all"},
}


def demo(
    out: Annotated[Path, typer.Option(help="run directory")] = Path("runs/demo"),
    rounds: Annotated[int | None, typer.Option(help="override the number of rounds")] = None,
    explain: ExplainOption = False,
) -> None:
    """Train on digits with backdoored clients, then compare every unlearning method."""
    from fedunlearn.cli import receipt
    from fedunlearn.config import parse_config
    from fedunlearn.report import plot_results, write_results
    from fedunlearn.runs import holds_run

    cfg = dict(DEMO_CONFIG)
    if rounds is not None:
        cfg["training"] = {**cfg["training"], "rounds": rounds}
    config = parse_config(cfg, "the built-in demo config")
    ensure_writable_output(out, "directory")
    resume = holds_run(out)
    if resume:
        _check_earlier_demo(out, config)
        err_console.print(f"{out} holds an earlier demo run with this config; continuing it")
    summary = run_training(config, out, resume, quiet=False)
    print_summary(summary, out)
    ids = summary["malicious_clients"]
    console.print(f"Removing the backdoored clients {ids} with every registered method ...")
    doc = run_comparison(out, ids, "recover", "all", {}, quiet=False)
    results = out / "comparison"
    write_results(doc, results)
    plot_results(doc, results)
    print_results(doc)
    console.print(receipt.LEGEND, style="dim")
    receipt.print_verdicts(doc, explain=explain)
    from fedunlearn.cli.deletion_ready import run_deletion_ready_demo

    run_deletion_ready_demo(out, console)
    console.print(f"Tables and plots in {results}/ ; inspect the run with: fedunlearn info {out}")


def _check_earlier_demo(out: Path, config: RunConfig) -> None:
    """Refuse to continue a run in ``out`` that is not this demo."""
    from fedunlearn.runs import load_run_config
    from fedunlearn.runs.rundir import config_differences, same_run_config

    earlier = load_run_config(out)
    if not same_run_config(earlier, config):
        fail(
            f"--out {out} holds another run ({config_differences(config, earlier)}; demo vs "
            f"that run); choose another --out, or remove {out} to start the demo afresh"
        )


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command()(cli_errors(demo))
