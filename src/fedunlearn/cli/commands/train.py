"""``fedunlearn train``: train a federation into a run directory, or ``--continue`` one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fedunlearn.cli.common import DataDirOption, cli_errors, ensure_writable_output
from fedunlearn.cli.printing import (
    GUARANTEE_SHORT,
    console,
    err_console,
    headline_epsilon,
    print_table,
)
from fedunlearn.cli.threads import threads_line
from fedunlearn.errors import ConfigError

if TYPE_CHECKING:
    from fedunlearn.config import RunConfig
    from fedunlearn.fl.records import RoundRecord

__all__ = ["ProgressObserver", "print_summary", "register", "run_training", "train"]


class ProgressObserver:
    """Round observer drawing a progress bar on stderr, started at the first finished round.

    Starting late keeps setup errors (config, data, an occupied --out) free of a stray bar.
    """

    def __init__(self, total: int, quiet: bool) -> None:
        self.total, self.quiet = total, quiet
        self.progress: Any = None
        self.task: Any = None

    def on_round_end(self, record: RoundRecord) -> None:
        """Advance the bar to ``record``'s round; show its accuracy (and ASR)."""
        if self.quiet:
            return
        if self.progress is None:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self.progress = Progress(
                TextColumn("round"),
                MofNCompleteColumn(),
                BarColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[status]}"),
                console=err_console,
            )
            self.progress.start()
            self.task = self.progress.add_task("train", total=self.total, status="")
        m = record.metrics
        if "test_accuracy" not in m:  # training.eval_every: the last measured round stays shown
            self.progress.update(self.task, completed=record.round)
            return
        text = f"acc {m['test_accuracy']:.3f}"
        if "backdoor_asr" in m:
            text += f"  asr {m['backdoor_asr']:.3f}"
        self.progress.update(self.task, completed=record.round, status=text)

    def close(self) -> None:
        """Stop the bar, if it started."""
        if self.progress is not None:
            self.progress.stop()


def run_training(
    config: RunConfig,
    out: Path,
    resume: bool,
    quiet: bool,
    repair: bool = False,
    tensorboard: Path | None = None,
) -> dict[str, Any]:
    """Train ``config`` into ``out`` with a progress bar (and a TensorBoard log); its summary."""
    from fedunlearn.runs import train_run

    observers: list[Any] = [ProgressObserver(config.training.rounds, quiet)]
    if tensorboard is not None:
        from fedunlearn.fl.tracking import TensorBoardWriter

        observers.append(TensorBoardWriter(tensorboard))
    try:
        return train_run(config, out, resume=resume, repair=repair, observers=observers)
    finally:
        for observer in observers:
            observer.close()


def print_summary(summary: dict[str, Any], out: Path) -> None:
    """Print a training's summary: final metrics, privacy, bytes, time, threads, device."""
    rows = [
        [key, f"{value:.4f}" if isinstance(value, float) else str(value)]
        for key, value in summary["final_metrics"].items()
    ]
    rows.append(["malicious clients", ", ".join(map(str, summary["malicious_clients"])) or "-"])
    uploads = summary.get("uploads")
    if uploads:
        rows.append(
            [
                "client uploads",
                f"{uploads['accepted']:,} accepted, {uploads['rejected']:,} rejected, "
                f"{uploads['missing']:,} missing",
            ]
        )
    rows.append(["stored bytes", f"{summary['stored_bytes']:,}"])
    if summary.get("privacy"):
        p = summary["privacy"]
        mechanism = p.get("mechanism", "client_update")
        rows.append(
            [
                "privacy",
                f"{mechanism} ({GUARANTEE_SHORT.get(mechanism, '')}), {p['dp_scope']}: "
                + headline_epsilon(p.get("epsilon"), p.get("realised_epsilon"), p["delta"]),
            ]
        )
    if summary.get("repaired"):
        rows.append(
            ["repaired", f"retrained from round {summary['repaired']['dropped_from_round']}"]
        )
    rows.append(["wall seconds", f"{summary['wall_seconds']:.1f}"])
    rows.append(["executor", summary["executor"]])
    line = threads_line(summary.get("torch_threads"))
    rows.append(["torch threads", line.removeprefix("torch threads: ")])
    if "device" in summary:
        rows.append(["device", summary["device"]])
    print_table(f"run {out}", None, rows)
    if uploads and not uploads["accepted"]:
        err_console.print(
            "warning: no client upload was accepted in any round, so the model is the initial "
            "one (the rejections are logged above: e.g. non-finite updates; lower training.lr)"
        )


def train(
    config_path: Annotated[
        Path | None, typer.Argument(metavar="CONFIG", help="YAML run config")
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="run directory to write")] = None,
    seed: Annotated[int | None, typer.Option(help="override the config's seed")] = None,
    data_dir: DataDirOption = None,
    resume: Annotated[bool, typer.Option(help="continue an interrupted run in --out")] = False,
    repair: Annotated[
        bool,
        typer.Option(help="with --resume: drop the first damaged round and later, retrain them"),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
    device: Annotated[
        str | None,
        typer.Option(help="override training.device: auto, cpu, cuda, cuda:<index> or mps"),
    ] = None,
    tensorboard: Annotated[
        Path | None,
        typer.Option(help="also write each round's metrics to this TensorBoard log directory"),
    ] = None,
    continue_dir: Annotated[
        Path | None,
        typer.Option(
            "--continue",
            metavar="RUN",
            help="train RUN further from its current model (after 'apply': the applied one); "
            "with --to-round T the command is safe to re-run (after an interruption, or twice)",
        ),
    ] = None,
    rounds: Annotated[
        int | None,
        typer.Option(help="with --continue: how many rounds to add (re-run: adds them again)"),
    ] = None,
    to_round: Annotated[
        int | None,
        typer.Option(
            "--to-round",
            help="with --continue: train to this round; once there, a re-run does nothing",
        ),
    ] = None,
) -> None:
    """Train a federation with history recording into a run directory (or --continue one)."""
    from fedunlearn.config import load_config

    if continue_dir is not None:
        if config_path is not None or out is not None or resume or repair:
            raise ConfigError(
                "--continue RUN takes the run directory only: drop CONFIG, --out, --resume and "
                "--repair (e.g. fedunlearn train --continue runs/q --to-round 40)"
            )
        _continue(continue_dir, rounds, to_round, as_json)
        return
    if config_path is None or out is None:
        raise ConfigError("give CONFIG and --out DIR (or --continue RUN --to-round T)")
    if rounds is not None or to_round is not None:
        raise ConfigError(
            "--rounds and --to-round go with --continue; set training.rounds in the config"
        )

    overrides: dict[str, Any] = {}
    if seed is not None:
        overrides["seed"] = seed
    if data_dir is not None:
        overrides["data.data_dir"] = str(data_dir)
    if device is not None:
        overrides["training.device"] = device
    config = load_config(config_path, overrides or None)
    ensure_writable_output(out, "directory")
    if tensorboard is not None:
        ensure_writable_output(tensorboard, "directory", "--tensorboard")
    summary = run_training(
        config, out, resume, quiet=as_json, repair=repair, tensorboard=tensorboard
    )
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary, out)


def _continue(run_dir: Path, rounds: int | None, to_round: int | None, as_json: bool) -> None:
    from fedunlearn.runs import continue_run, continue_target

    target = continue_target(run_dir, rounds, to_round=to_round)
    observer = ProgressObserver(target, quiet=as_json)
    try:
        summary = continue_run(run_dir, rounds, to_round=to_round, observers=[observer])
    finally:
        observer.close()
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    if summary["already_done"]:
        console.print(f"{run_dir} is at round {summary['target']} already: nothing to do")
        return
    metrics = ", ".join(
        f"{k} {v:.4f}" for k, v in summary["final_metrics"].items() if isinstance(v, float)
    )
    resumed = summary["resumed_from_round"]
    console.print(
        f"{run_dir}: rounds {summary['from_round'] + 1}..{summary['target']} trained"
        + (f" (resumed after round {resumed})" if resumed is not None else "")
        + f" without forgotten client(s) {summary['forgotten_clients'] or '-'}; {metrics}"
    )


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command()(cli_errors(train))
