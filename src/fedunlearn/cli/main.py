"""The ``fedunlearn`` command: train, info, methods, unlearn, compare, export, demo.

Commands only parse arguments, call library functions and print; the library never imports this.
Errors of the library (``FedUnlearnError``) end the command with exit code 2 and one clear message.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fedunlearn.cli.central import central_command
from fedunlearn.cli.export import (
    check_model_path,
    export_result,
    export_round,
    run_model,
    save_result_model,
)
from fedunlearn.cli.starfish import register as register_starfish
from fedunlearn.config import RunConfig, load_config, parse_config
from fedunlearn.errors import ConfigError, FedUnlearnError
from fedunlearn.fl.records import RoundRecord
from fedunlearn.fl.tracking import TensorBoardWriter
from fedunlearn.report import compare_methods, plot_results, unlearn_one, write_results
from fedunlearn.report.tables import table_rows
from fedunlearn.runs import load_run_config, run_info, train_run
from fedunlearn.unlearn import available_methods, get_method

app = typer.Typer(
    help="Federated unlearning and recovery from poisoning.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])

DEMO_CONFIG: dict[str, Any] = {
    "seed": 0,
    "data": {"dataset": "digits", "num_clients": 10, "partition": "iid"},
    "model": {"name": "mlp", "hidden": [64]},
    "training": {"rounds": 30, "local_epochs": 2, "lr": 0.1, "batch_size": 32},
    "attack": {"kind": "backdoor", "num_malicious": 2, "target_label": 0, "trigger_size": 3},
    "history": {"policy": "all"},
}


def _friendly_errors(func: F) -> F:
    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except FedUnlearnError as err:
            err_console.print(f"[bold red]error:[/] {type(err).__name__}: {err}")
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


class _ProgressObserver:
    def __init__(self, progress: Progress, task: Any) -> None:
        self.progress, self.task = progress, task

    def on_round_end(self, record: RoundRecord) -> None:
        m = record.metrics
        text = f"acc {m.get('test_accuracy', float('nan')):.3f}"
        if "backdoor_asr" in m:
            text += f"  asr {m['backdoor_asr']:.3f}"
        self.progress.update(self.task, completed=record.round, status=text)


def _train(
    config: RunConfig, out: Path, resume: bool, quiet: bool, tensorboard: Path | None = None
) -> dict[str, Any]:
    columns = (
        TextColumn("round"),
        MofNCompleteColumn(),
        BarColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
    )
    writer = TensorBoardWriter(tensorboard) if tensorboard is not None else None
    try:
        with Progress(*columns, console=err_console, disable=quiet) as progress:
            task = progress.add_task("train", total=config.training.rounds, status="")
            observers: list[Any] = [_ProgressObserver(progress, task)]
            if writer is not None:
                observers.append(writer)
            return train_run(config, out, resume=resume, observers=observers)
    finally:
        if writer is not None:
            writer.close()


def _print_summary(summary: dict[str, Any], out: Path) -> None:
    table = Table(title=f"run {out}", show_header=False)
    for key, value in summary["final_metrics"].items():
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    table.add_row("malicious clients", ", ".join(map(str, summary["malicious_clients"])) or "-")
    table.add_row("stored bytes", f"{summary['stored_bytes']:,}")
    if summary.get("privacy"):
        p = summary["privacy"]
        table.add_row(
            "privacy",
            f"{p['dp_scope']}: total eps {p['total_epsilon']:.3f} at delta {p['delta']:g}",
        )
    table.add_row("wall seconds", f"{summary['wall_seconds']:.1f}")
    table.add_row("executor", summary["executor"])
    if "device" in summary:
        table.add_row("device", summary["device"])
    console.print(table)


@app.command()
@_friendly_errors
def train(
    config_path: Annotated[Path, typer.Argument(metavar="CONFIG", help="YAML run config")],
    out: Annotated[Path, typer.Option("--out", help="run directory to write")],
    seed: Annotated[int | None, typer.Option(help="override the config's seed")] = None,
    resume: Annotated[bool, typer.Option(help="continue an interrupted run in --out")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
    device: Annotated[
        str | None,
        typer.Option(help="override training.device: auto, cpu, cuda, cuda:<index> or mps"),
    ] = None,
    tensorboard: Annotated[
        Path | None,
        typer.Option(help="also write each round's metrics to this TensorBoard log directory"),
    ] = None,
) -> None:
    """Train a federation with history recording into a run directory."""
    overrides: dict[str, Any] = {}
    if seed is not None:
        overrides["seed"] = seed
    if device is not None:
        overrides["training.device"] = device
    config = load_config(config_path, overrides or None)
    summary = _train(config, out, resume, quiet=as_json, tensorboard=tensorboard)
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        _print_summary(summary, out)


@app.command()
@_friendly_errors
def info(
    run_dir: Annotated[Path, typer.Argument(help="run directory")],
    as_json: Annotated[bool, typer.Option("--json", help="print everything as JSON")] = False,
) -> None:
    """Show what a run stored: rounds, bytes, attack, malicious clients, metrics."""
    data = run_info(run_dir)
    if as_json:
        print(json.dumps(data, indent=2))
        return
    table = Table(title=f"run {run_dir}", show_header=False)
    for key in (
        "dataset",
        "model",
        "num_params",
        "num_clients",
        "history_policy",
        "attack",
        "malicious_clients",
    ):
        table.add_row(key, str(data[key]))
    table.add_row("rounds", f"{data['rounds_completed']} of {data['rounds_planned']}")
    table.add_row("stored bytes", f"{data['stored_bytes']:,} ({data['file_bytes']:,} on disk)")
    for kind, size in data["stored_bytes_by_kind"].items():
        table.add_row(f"  {kind}", f"{size:,}")
    privacy = data.get("privacy") or {}
    if privacy.get("enabled") and privacy.get("rounds"):
        totals = privacy["totals"][str(privacy["sens_factor"])] or {}
        table.add_row(
            "privacy",
            f"DP {privacy['dp_scope']}, {privacy['noise_mode']} noise, "
            f"S = {privacy['clip_norm']:.4g} ({privacy['clip_norm_source']}), "
            f"delta = {privacy['delta']:g}",
        )
        eps = [r["epsilon"] for r in privacy["rounds"]]
        table.add_row("  eps_t per round", ", ".join(f"{e:.3g}" for e in eps))
        table.add_row(
            "  noise multiplier",
            f"{privacy['noise_multiplier_min']:.4g} .. {privacy['noise_multiplier_max']:.4g} "
            f"(std / S); noise-to-signal median {privacy['noise_to_signal_median']:.3g}",
        )
        table.add_row(
            f"  total eps (delta {privacy['delta']:g})",
            f"PLD {totals.get('pld_epsilon', 0):.3f}, RDP {totals.get('rdp_epsilon', 0):.3f}, "
            f"zCDP {totals.get('zcdp_epsilon', 0):.3f}, basic {totals.get('basic_epsilon', 0):.3f}",
        )
    console.print(table)
    if data["metrics"]:
        last = data["metrics"][-1]
        console.print(
            "last round: " + ", ".join(f"{k} {v:.4f}" for k, v in last.items() if k != "round")
        )


def _parse_forget(value: str, run_dir: Path) -> tuple[list[int], str]:
    """Parse ``--forget``: ``3,7`` or ``malicious`` (the run's attackers: a recovery request)."""
    if value.strip() == "malicious":
        malicious = run_info(run_dir)["malicious_clients"]
        if not malicious:
            raise ConfigError(f"--forget malicious: {run_dir} has no malicious clients")
        return list(malicious), "recover"
    try:
        ids = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(
            f"--forget takes comma-separated client ids or 'malicious'; got {value!r}"
        ) from None
    if not ids:
        raise ConfigError("--forget is empty: name at least one client id (e.g. --forget 3,7)")
    return ids, "forget"


def _parse_params(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--param takes key=value; got {item!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out


def _print_results(doc: dict[str, Any]) -> None:
    header, rows = table_rows(doc, compact=True)
    table = Table(title=f"{doc['request']['kind']} clients {doc['request']['forget']}")
    for col in header:
        table.add_column(col, justify="left" if col == "method" else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)


@app.command()
@_friendly_errors
def methods() -> None:
    """List the registered unlearning methods and their hyperparameters."""
    table = Table(title="unlearning methods")
    table.add_column("method")
    table.add_column("history policies")
    table.add_column("parameters (default)")
    for name in available_methods():
        cls = get_method(name)
        fields = cls.params_type.model_fields
        params = ", ".join(f"{k}={v.default!r}" for k, v in fields.items()) or "-"
        policies = ", ".join(sorted(cls.required_policies)) if cls.required_policies else "any"
        table.add_row(name, policies, params)
    console.print(table)


@app.command()
@_friendly_errors
def unlearn(
    run_dir: Annotated[Path, typer.Argument(help="finished run directory")],
    forget: Annotated[str, typer.Option(help="client ids '3,7', or 'malicious'")],
    method: Annotated[str, typer.Option(help="registered method (see 'fedunlearn methods')")],
    out: Annotated[Path, typer.Option(help="result JSON to write")],
    param: Annotated[list[str] | None, typer.Option(help="method parameter key=value")] = None,
    save_model: Annotated[
        Path | None,
        typer.Option(help="also save the model: a .safetensors file (load_model reads it)"),
    ] = None,
) -> None:
    """Remove clients from a trained run with one method; write the result JSON."""
    if save_model is not None:
        check_model_path(save_model, "--save-model")
    ids, kind = _parse_forget(forget, run_dir)
    result, summary = unlearn_one(
        run_dir, ids, method, params=_parse_params(param or []), kind=kind
    )
    if save_model is not None:
        save_result_model(save_model, run_dir, run_model(run_dir), result.params, summary)
        summary["model_file"] = str(save_model)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    console.print(
        f"{method}: test accuracy {summary['test_accuracy']:.4f}, "
        f"{summary['costs']['client_epochs']} client epochs, "
        f"{summary['costs']['wall_seconds']:.1f} s -> {out}"
    )


@app.command()
@_friendly_errors
def compare(
    run_dir: Annotated[Path, typer.Argument(help="finished run directory")],
    forget: Annotated[str, typer.Option(help="client ids '3,7', or 'malicious'")],
    out: Annotated[Path, typer.Option(help="directory for results.* and plots")],
    methods_: Annotated[
        str, typer.Option("--methods", help="comma-separated methods, or 'all' (all it supports)")
    ] = "all",
    params_file: Annotated[Path | None, typer.Option(help="YAML {method: {param: value}}")] = None,
    seed: Annotated[int, typer.Option(help="seed of the evaluation attacks")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print results.json")] = False,
) -> None:
    """Run several methods on a run and write results.json/csv/md and PNG plots."""
    ids, kind = _parse_forget(forget, run_dir)
    doc = _compare(run_dir, ids, kind, methods_, params_file, seed, quiet=as_json)
    write_results(doc, out)
    plot_results(doc, out)
    if as_json:
        print(json.dumps(doc, indent=2))
    else:
        _print_results(doc)
        console.print(f"wrote {out}/results.json, results.csv, results.md and plots")


def _compare(
    run_dir: Path,
    ids: list[int],
    kind: str,
    methods_: str,
    params_file: Path | None,
    seed: int,
    *,
    quiet: bool,
) -> dict[str, Any]:
    names = [m.strip() for m in methods_.split(",")]
    if methods_ == "all":  # every method the run's history supports (e.g. fedadp on a fedadp run)
        policy = load_run_config(run_dir).history.policy
        names = [
            n
            for n in available_methods()
            if get_method(n).required_policies is None
            or policy in (get_method(n).required_policies or ())
        ]
    params: dict[str, Any] = {}
    if params_file is not None:
        params = yaml.safe_load(params_file.read_text()) or {}
        if not isinstance(params, dict):
            raise ConfigError(f"{params_file} must map method names to parameter mappings")
    with err_console.status("unlearning", spinner="dots") as status:

        def tell(name: str) -> None:
            if not quiet:
                status.update(f"running {name}")

        return compare_methods(
            run_dir, ids, names, params=params, kind=kind, seed=seed, progress=tell
        )


@app.command()
@_friendly_errors
def export(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN", help="run directory")],
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
    if round_ is not None and result is not None:
        raise ConfigError("pass --round or --result, not both")
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


@app.command()
@_friendly_errors
def demo(
    out: Annotated[Path, typer.Option(help="run directory")] = Path("runs/demo"),
    rounds: Annotated[int | None, typer.Option(help="override the number of rounds")] = None,
) -> None:
    """Train on digits with backdoored clients, then compare every unlearning method."""
    cfg = dict(DEMO_CONFIG)
    if rounds is not None:
        cfg["training"] = {**cfg["training"], "rounds": rounds}
    config = parse_config(cfg, "the built-in demo config")
    resume = (out / "history").exists()
    if resume:
        err_console.print(f"{out} holds an earlier demo run; continuing it (delete it to restart)")
    summary = _train(config, out, resume, quiet=False)
    _print_summary(summary, out)
    ids = summary["malicious_clients"]
    console.print(f"Removing the backdoored clients {ids} with every registered method ...")
    doc = _compare(out, ids, "recover", "all", None, 0, quiet=False)
    results = out / "comparison"
    write_results(doc, results)
    plot_results(doc, results)
    _print_results(doc)
    console.print(f"Tables and plots in {results}/ ; inspect the run with: fedunlearn info {out}")


app.command(name="central")(central_command)
register_starfish(app)


def main() -> None:  # pragma: no cover - console entry point
    """Run the CLI."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    app(prog_name="fedunlearn")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
