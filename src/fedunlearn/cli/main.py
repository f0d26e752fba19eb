"""The ``fedunlearn`` command: train, info, verify, forget, unlearn, apply, compare, audit, ....

Commands only parse arguments, call library functions and print; the library never imports this.
Every user-facing failure is one line on stderr naming the path or field and what to do, with
exit code 1 for a damaged store and 2 otherwise, never 1 by accident (``cli.common.cli_errors``;
``fedunlearn --debug <command>`` shows the traceback; docs/faults.md). Outputs are checked
writable, with room for a model, before any work (``cli.common.ensure_writable_output``). torch, the
methods and the reports are imported inside the commands that use them, so ``fedunlearn --help``
and ``--version`` answer without loading them.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from fedunlearn import __version__
from fedunlearn.cli.common import (
    ClientTestOption,
    DistanceRetrainsOption,
    ExplainOption,
    FinishedRunArg,
    ForgetOption,
    ForgetSamplesOption,
    ReferenceOption,
    RunArg,
    ThresholdOption,
    ThresholdsFileOption,
    cli_errors,
    describe_os_error,
    ensure_writable_output,
    fail,
    install_warning_format,
    parse_client_ids,
    parse_forget,
    parse_forget_samples,
    parse_params,
    set_debug,
)
from fedunlearn.cli.plan import readiness_rows
from fedunlearn.cli.threads import MAX_THREADS, apply_threads, threads_line
from fedunlearn.errors import ConfigError, UnknownMethodError

if TYPE_CHECKING:
    from fedunlearn.config import RunConfig
    from fedunlearn.fl.records import RoundRecord

app = typer.Typer(
    help="Federated unlearning and recovery from poisoning.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(soft_wrap=True)  # piped output: no line breaks at 80 columns
err_console = Console(stderr=True)

# Every command is wrapped by it (the name other modules of this package decorate with).
_friendly_errors = cli_errors

DEMO_CONFIG: dict[str, Any] = {
    "seed": 0,
    "data": {"dataset": "digits", "num_clients": 10, "partition": "iid"},
    "model": {"name": "mlp", "hidden": [64]},
    "training": {"rounds": 30, "local_epochs": 2, "lr": 0.1, "batch_size": 32},
    "attack": {"kind": "backdoor", "num_malicious": 2, "target_label": 0, "trigger_size": 3},
    "history": {"policy": "all"},
}


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


# ----- printing --------------------------------------------------------------------------------


def _print_table(title: str, header: list[str] | None, rows: list[list[str]]) -> None:
    """Print a table: boxed on a terminal, Markdown (never wrapped) when piped.

    ``header`` None makes a two-column key-value table.
    """
    if console.is_terminal:
        from rich.table import Table

        table = Table(title=title, show_header=header is not None)
        for i, col in enumerate(header or ["", ""]):
            table.add_column(col, justify="right" if header and i else "left")
        for row in rows:
            table.add_row(*row)
        console.print(table)
        return
    cols = header or ["field", "value"]
    lines = [title, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    print("\n".join(lines))


class _ProgressObserver:
    """Round observer drawing a progress bar on stderr, started at the first finished round.

    Starting late keeps setup errors (config, data, an occupied --out) free of a stray bar.
    """

    def __init__(self, total: int, quiet: bool) -> None:
        self.total, self.quiet = total, quiet
        self.progress: Any = None
        self.task: Any = None

    def on_round_end(self, record: RoundRecord) -> None:
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
        text = f"acc {m.get('test_accuracy', float('nan')):.3f}"
        if "backdoor_asr" in m:
            text += f"  asr {m['backdoor_asr']:.3f}"
        self.progress.update(self.task, completed=record.round, status=text)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def _train(
    config: RunConfig,
    out: Path,
    resume: bool,
    quiet: bool,
    repair: bool = False,
    tensorboard: Path | None = None,
) -> dict[str, Any]:
    from fedunlearn.runs import train_run

    observers: list[Any] = [_ProgressObserver(config.training.rounds, quiet)]
    if tensorboard is not None:
        from fedunlearn.fl.tracking import TensorBoardWriter

        observers.append(TensorBoardWriter(tensorboard))
    try:
        return train_run(config, out, resume=resume, repair=repair, observers=observers)
    finally:
        for observer in observers:
            observer.close()


def _print_summary(summary: dict[str, Any], out: Path) -> None:
    rows = [
        [key, f"{value:.4f}" if isinstance(value, float) else str(value)]
        for key, value in summary["final_metrics"].items()
    ]
    rows.append(["malicious clients", ", ".join(map(str, summary["malicious_clients"])) or "-"])
    rows.append(["stored bytes", f"{summary['stored_bytes']:,}"])
    if summary.get("privacy"):
        p = summary["privacy"]
        mechanism = p.get("mechanism", "client_update")
        rows.append(
            [
                "privacy",
                f"{mechanism} ({_GUARANTEE_SHORT.get(mechanism, '')}), {p['dp_scope']}: "
                + _headline_epsilon(p.get("epsilon"), p.get("realised_epsilon"), p["delta"]),
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
    _print_table(f"run {out}", None, rows)


# ----- train, info, verify, forget ------------------------------------------------------------


@app.command()
@_friendly_errors
def train(
    config_path: Annotated[
        Path | None, typer.Argument(metavar="CONFIG", help="YAML run config")
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="run directory to write")] = None,
    seed: Annotated[int | None, typer.Option(help="override the config's seed")] = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="override data.data_dir (where dataset files are)")
    ] = None,
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
    summary = _train(config, out, resume, quiet=as_json, repair=repair, tensorboard=tensorboard)
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        _print_summary(summary, out)


def _continue(run_dir: Path, rounds: int | None, to_round: int | None, as_json: bool) -> None:
    from fedunlearn.runs import continue_run, continue_target

    target = continue_target(run_dir, rounds, to_round=to_round)
    observer = _ProgressObserver(target, quiet=as_json)
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


@app.command()
@_friendly_errors
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
    replaced = (
        f"rounds {kept + 1}..{event['rounds_before']} replaced by the {event['method']} "
        f"trajectory (rounds 1..{kept} kept: the deleted data never touched them; "
        if kept
        else f"rounds 1..{event['rounds_before']} replaced by the {event['method']} trajectory ("
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


@app.command()
@_friendly_errors
def info(
    run_dir: RunArg,
    as_json: Annotated[bool, typer.Option("--json", help="print everything as JSON")] = False,
) -> None:
    """Show what a run stored (rounds, bytes, clients, metrics) and check it; exit 1 if damaged."""
    from fedunlearn.runs import run_info

    data = run_info(run_dir)
    if as_json:
        print(json.dumps(data, indent=2))
    else:
        _print_info(data, run_dir)
    if data["problems"]:
        raise typer.Exit(1)


#: What one unit of ε protects, per ``privacy.mechanism`` (the ledger's ``guarantee`` says more).
_GUARANTEE_SHORT = {
    "dp_sgd": "eps per training example (replace-one), not per client",
    "client_update": "eps per client and round (replace one client's data)",
}


def _headline_epsilon(guarantee: float | None, realised: float | None, delta: float) -> str:
    """The guarantee first (a priori), the realised schedule's total beside it, labelled."""
    first = "guarantee eps -" if guarantee is None else f"guarantee eps {guarantee:.3f}"
    second = (
        "" if realised is None else f"; realised {realised:.3f} (data-dependent, not a guarantee)"
    )
    return f"{first} (a priori, replace-one) at delta {delta:g}{second}"


def _privacy_rows(privacy: dict[str, Any]) -> list[list[str]]:
    """Rows of ``info`` for a run's privacy ledger: mechanism, guarantee, budget, totals."""
    mechanism = privacy.get("mechanism", "client_update")
    totals = privacy["totals"].get(privacy.get("neighbour_relation", "replace_one")) or {}
    delta = privacy["delta"]
    guarantee = privacy.get("epsilon_guarantee")
    rows = [
        [
            "privacy",
            f"mechanism {mechanism} ({_GUARANTEE_SHORT.get(mechanism, '')}), "
            + _headline_epsilon(
                (guarantee or {}).get("pld_epsilon"), privacy.get("realised_epsilon"), delta
            ),
        ],
        ["  protects", str(privacy["guarantee"])],
    ]
    if mechanism == "dp_sgd":
        rows.append(
            [
                "  DP-SGD",
                f"C = {privacy['clip_norm']:.4g} per example ({privacy['clip_norm_source']}), "
                f"sample rate q <= {privacy['sample_rate_max']:.4g}, "
                f"<= {privacy['steps_max']} steps per round",
            ]
        )
        unit = "sigma_t = std / C"
    else:
        rows.append(
            [
                "  client update",
                f"{privacy['dp_scope']}, {privacy['noise_mode']} noise, "
                f"S = {privacy['clip_norm']:.4g} ({privacy['clip_norm_source']})",
            ]
        )
        unit = "std / S"
    eps = [r["epsilon"] for r in privacy["rounds"]]
    rows.append(["  eps_t per round", ", ".join(f"{e:.3g}" for e in eps)])
    nsr = privacy["noise_to_signal_median"]
    rows.append(
        [
            "  noise multiplier",
            f"{privacy['noise_multiplier_min']:.4g} .. {privacy['noise_multiplier_max']:.4g} "
            f"({unit}); noise-to-signal median " + (f"{nsr:.3g}" if nsr is not None else "-"),
        ]
    )
    parts = [
        f"{label} {totals[key]:.3f}"
        for key, label in (
            ("pld_epsilon", "PLD"),
            ("rdp_epsilon", "RDP"),
            ("zcdp_epsilon", "zCDP"),
            ("basic_epsilon", "basic"),
        )
        if totals.get(key) is not None
    ]
    if guarantee:  # the a-priori bound: the headline
        rows.append(
            [
                "  guarantee (a priori)",
                f"eps {guarantee['pld_epsilon']:.3f} (PLD, replace-one; add/remove would be "
                f"{guarantee['add_remove_pld_epsilon']:.3f} if n_c were hidden): every round at "
                f"eps_max = {guarantee['per_round_epsilon']:g}; conditional on the realised "
                "schedule, which reads the noise-free server loss and is not covered",
            ]
        )
        if guarantee.get("ended_at_generation") is not None:
            rows.append(["  guarantee ended", str(guarantee["note"])])
        releases = guarantee.get("with_unlearning_releases")
        if releases:
            rows.append(
                [
                    "  with applied releases",
                    f"eps {releases['epsilon']:.3f}, delta {releases['delta']:g}: the run's rounds "
                    f"and {releases['releases']} applied DP result(s), composed sequentially",
                ]
            )
    rows.append([f"  realised (data-dependent, delta {delta:g})", ", ".join(parts) or "-"])
    replaced = sum(1 for r in privacy["rounds"] if r.get("replaced_by_generation"))
    if replaced:
        rows.append(
            [
                "  replaced rounds",
                f"{replaced} DP round(s) an applied trajectory replaced: still counted (their "
                "uploads were released)",
            ]
        )
    for name, artefact in (privacy.get("artefacts") or {}).items():
        state = "DP" if artefact["dp"] else "not DP"
        rows.append([f"  {name.replace('_', ' ')}", f"{state}: {artefact['guarantee']}"])
    return rows


def _print_info(data: dict[str, Any], run_dir: Path) -> None:
    rows = [
        [key, str(data[key])]
        for key in (
            "dataset",
            "model",
            "num_params",
            "num_clients",
            "history_policy",
            "attack",
            "malicious_clients",
        )
    ]
    rows.append(["rounds", f"{data['rounds_completed']} of {data['rounds_planned']}"])
    rows.append(["forgotten clients", ", ".join(map(str, data["forgotten_clients"])) or "-"])
    how = data.get("serving")
    if how is not None:  # a Flower app's run: its clients keep their data
        queued = how["queued"]
        waiting = f"; queued: {queued['kind']} {queued['forget']} with {queued['method']}"
        rows.append(
            [
                "requests",
                f"served by the Flower app '{how['app']}': 'fedunlearn unlearn' queues one, "
                f"'{how['command']}' serves it{waiting if queued else ''}",
            ]
        )
    for event in data.get("events", []):
        rows.append(
            [
                f"generation {event['generation']}",
                f"{event['method']} applied ({event['kind']}): forgot {event['forget']} "
                f"(new {event['new']}), rounds {event['rounds_before']} -> "
                f"{event['rounds_after']}",
            ]
        )
    rows.append(["stored bytes", f"{data['stored_bytes']:,} ({data['file_bytes']:,} on disk)"])
    for kind, size in data["stored_bytes_by_kind"].items():
        rows.append([f"  {kind}", f"{size:,}"])
    privacy = data.get("privacy") or {}
    if privacy.get("enabled") and privacy.get("rounds"):
        rows.extend(_privacy_rows(privacy))
    rows.extend(readiness_rows(data.get("deletion_readiness")))
    check = data["check"]
    how = "every payload" if check["full"] else "models and catalog; 'fedunlearn verify' reads all"
    state = "ok" if not data["problems"] else f"{len(data['problems'])} problem(s)"
    rows.append(["check", f"{state} ({check['payloads_checked']} payloads read: {how})"])
    _print_table(f"run {run_dir}", None, rows)
    if data["metrics"]:
        last = data["metrics"][-1]
        console.print(
            "last round: "
            + ", ".join(
                f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                for k, v in last.items()
                if k != "round"
            ),
            soft_wrap=True,
        )
    for problem in data["problems"]:
        sys.stderr.write(f"problem: {problem}\n")


@app.command()
@_friendly_errors
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


@app.command()
@_friendly_errors
def forget(
    run_dir: RunArg,
    clients: Annotated[str, typer.Option(help="client ids to erase, e.g. 3,7")],
    vacuum: Annotated[
        str, typer.Option(help="'incremental' (default) or 'full' (rewrite the whole file)")
    ] = "incremental",
    as_json: Annotated[bool, typer.Option("--json", help="print the record as JSON")] = False,
) -> None:
    """Erase clients' stored updates from a run's history; print the deletion record.

    Also drops the stored aggregates and global models that would rebuild a deleted update
    (never M_0 or the last model). The last model keeps the clients' influence: remove it with
    'fedunlearn unlearn'.
    """
    from fedunlearn.history.store import HistoryStore
    from fedunlearn.history.store.reconstruction import reconstructible_updates
    from fedunlearn.history.store.records import format_ids
    from fedunlearn.runs import HISTORY_DIR, forget_clients
    from fedunlearn.runs.forget import result_files_holding

    if vacuum not in ("incremental", "full"):
        raise ConfigError(f"--vacuum must be 'incremental' or 'full'; got {vacuum!r}")
    ids = parse_client_ids(clients)
    files = result_files_holding(run_dir, ids)  # forget_clients deletes them too
    record = forget_clients(run_dir, ids, vacuum=vacuum)  # type: ignore[arg-type]
    with HistoryStore.open(run_dir / HISTORY_DIR) as store:
        check = store.check_deletions(ids)
        rebuildable = reconstructible_updates(store, ids)
    if as_json:
        doc = {"record": record.to_dict(), "check": check.to_dict(), "removed_files": files}
        print(json.dumps(doc | {"reconstructible": rebuildable}, indent=2))
    else:
        for entry in files:
            console.print(
                f"deleted result file {entry['path']} ({entry['size_bytes']:,} bytes): it held "
                f"{len(entry['updates'])} update(s) of these clients"
            )
        rounds: dict[int, list[int]] = {}
        for p in record.payloads:
            rounds.setdefault(p.client_id, []).append(p.round)
        for cid in record.client_ids:
            got = rounds.get(cid, [])
            console.print(
                f"client {cid}: {len(got)} stored update(s) deleted"
                + (f" (rounds {got[0]}..{got[-1]})" if got else " (none left to delete)")
            )
        if record.models:
            kinds: dict[str, list[int]] = {}
            for m in record.models:
                kinds.setdefault(m.kind, []).append(m.round)
            shown = "; ".join(
                f"{len(rs)} {kind} model(s) (rounds {format_ids(rs)})"
                for kind, rs in sorted(kinds.items())
            )
            console.print(
                f"dropped {shown}, {record.model_bytes:,} bytes: with the updates still stored "
                "they would let the deleted updates be rebuilt; methods that read round models "
                "now refuse this run (retrain and federaser still serve it)"
            )
        when = datetime.fromtimestamp(record.forgotten_at, tz=UTC).isoformat(timespec="seconds")
        console.print(
            f"deleted {record.size_bytes:,} payload bytes; the files shrank by "
            f"{record.bytes_reclaimed:,} bytes ({record.vacuum} vacuum); record #{record.id} "
            f"at {when}"
        )
        console.print(
            f"check: {check.unreadable}/{check.payloads_checked} deleted payloads unreadable, "
            f"{check.fingerprints_found} of {check.fingerprints_checked} page fingerprints found "
            f"(scan calibrated on {check.control_found}/{check.control_checked} live pages)"
            + (
                f"; {check.not_scanned} payload(s) fitted inside a b-tree page: zeroed in "
                "place, not scannable"
                if check.not_scanned
                else ""
            )
        )
        if check.inconclusive_reason:
            console.print(f"scan inconclusive: {check.inconclusive_reason}")
        if rebuildable:
            shown = ", ".join(f"round {r} client {c}" for r, c in rebuildable[:5])
            console.print(
                f"still rebuildable: {len(rebuildable)} deleted update(s) ({shown}): aggregated "
                "in a single round, so the kept M_0 and last model with the other rounds' "
                "updates give it; making an unlearned model the run's model removes it"
            )
    if not check.ok:
        for problem in check.problems:
            sys.stderr.write(f"problem: {problem}\n")
        raise typer.Exit(1)


# ----- methods, unlearn, compare, demo --------------------------------------------------------


def _print_results(doc: dict[str, Any]) -> None:
    from fedunlearn.report.tables import COST_NOTE, cost_rows, shared_receipt_seconds, table_rows

    header, rows = table_rows(doc, compact=True)
    _print_table(f"{doc['request']['kind']} clients {doc['request']['forget']}", list(header), rows)
    header, rows = cost_rows(doc)
    _print_table("costs (this machine, this run)", header, rows)
    shared = shared_receipt_seconds(doc)
    console.print(
        COST_NOTE
        + (f" Shared references: {shared:.1f} s." if shared is not None else "")
        + f" The comparison took {doc['wall_seconds']:.1f} s in all.",
        highlight=False,
    )


@app.command()
@_friendly_errors
def methods() -> None:
    """List the registered unlearning methods and their hyperparameters."""
    from fedunlearn.unlearn import available_methods, get_method

    rows = []
    for name in available_methods():
        cls = get_method(name)
        fields = dict(cls.params_type.model_fields)
        execution = getattr(cls, "execution_type", None)  # e.g. Starfish's backend options
        if execution is not None:
            fields.update(execution.model_fields)
        params = ", ".join(f"{k}={v.default!r}" for k, v in fields.items()) or "-"
        policies = ", ".join(sorted(cls.required_policies)) if cls.required_policies else "any"
        rows.append([name, policies, params])
    _print_table("unlearning methods", ["method", "history policies", "parameters (default)"], rows)


@app.command()
@_friendly_errors
def unlearn(
    run_dir: FinishedRunArg,
    method: Annotated[str, typer.Option(help="registered method (see 'fedunlearn methods')")],
    out: Annotated[Path, typer.Option(help="result JSON to write")],
    forget: ForgetOption = "",
    forget_samples: ForgetSamplesOption = None,
    param: Annotated[list[str] | None, typer.Option(help="method parameter key=value")] = None,
    save_model: Annotated[
        Path | None,
        typer.Option(help="also save the model: a .safetensors file (load_model reads it)"),
    ] = None,
    reference: ReferenceOption = "original",
    thresholds: ThresholdsFileOption = None,
    threshold: ThresholdOption = None,
    client_test: ClientTestOption = True,
    distance_retrains: DistanceRetrainsOption = 0,
    explain: ExplainOption = False,
    apply_file: Annotated[
        bool,
        typer.Option(
            "--apply-file/--no-apply-file",
            help="write R.apply.safetensors beside --out (the model and the method's trajectory, "
            "up to the size of the run's store); 'fedunlearn apply' needs it",
        ),
    ] = True,
) -> None:
    """Remove clients from a trained run with one method; verify it; write the result JSON.

    Exit code 1 when the receipt finds the forgotten clients' influence remains, 2 on bad input.
    """
    from fedunlearn.cli.export import check_model_path, model_bytes

    # before the work: the apply file and the model hold the model's bytes at least
    need = (int(apply_file) + int(save_model is not None)) * model_bytes(run_dir) + 2**20
    ensure_writable_output(out, "file", need_bytes=need)
    if save_model is not None:
        check_model_path(save_model, "--save-model")
        ensure_writable_output(save_model, "file", "--save-model", need_bytes=need)
    samples = parse_forget_samples(forget_samples or [])
    if not forget.strip() and not samples:
        raise ConfigError(
            "--forget is empty: name what to remove: --forget 3,7 (clients), --forget "
            "malicious, or --forget-samples CLIENT:FILE (samples of a client)"
        )
    ids, kind = parse_forget(forget, run_dir) if forget.strip() else ([], "forget")
    if _queued_for_app(run_dir, ids, kind, method, param or [], out, bool(samples)):
        return
    from fedunlearn.cli import receipt
    from fedunlearn.experiments import unlearn_one

    limits = receipt.load_thresholds(thresholds, threshold)
    with receipt.RoundProgress() as progress:
        result, summary = unlearn_one(
            run_dir,
            ids,
            method,
            params=parse_params(param or []),
            kind=kind,
            reference=reference,
            thresholds=limits,
            progress=progress,
            client_test=client_test,
            distance_retrains=distance_retrains,
            samples=samples,
        )
    if save_model is not None:
        summary["model_file"] = str(save_model)  # named in the sealed JSON, written after it
    out.parent.mkdir(parents=True, exist_ok=True)
    from fedunlearn.experiments import write_result

    # the apply file, then the sealed JSON, atomically
    spec = write_result(out, summary, result, apply_file=apply_file)
    console.print(_apply_file_line(out, spec, result), highlight=False)
    if save_model is not None:
        from fedunlearn.cli.export import run_model, save_result_model

        try:
            save_result_model(save_model, run_dir, run_model(run_dir), result.params, summary)
        except OSError as err:
            fail(
                f"--save-model {describe_os_error(err)}; {out} and its apply file were written "
                f"(apply it, or export the model later: fedunlearn export {run_dir} --result "
                f"{out} --out {save_model})"
            )
    req = summary["request"]
    if req.get("earlier"):
        console.print(
            f"request: forget {req['forget']} (new {req['new']}; forgotten earlier "
            f"{req['earlier']}, forgotten again)"
        )
    console.print(
        f"{method}: test accuracy {summary['test_accuracy']:.4f} -> {out}", highlight=False
    )
    for line in cost_lines(summary):
        console.print(f"  {line}", highlight=False)
    console.print(f"  {threads_line(summary.get('torch_threads'))}", highlight=False)
    receipt.print_verification(
        summary["verification"], title=f"{method} verification", explain=explain
    )
    if receipt.exit_code(summary["verification"]):
        raise typer.Exit(1)


def _apply_file_line(out: Path, spec: dict[str, Any], result: Any) -> str:
    """Say where the apply file is and how large (or that none was written)."""
    if spec["file"] is None:
        return (
            "apply file: none written (--no-apply-file): 'fedunlearn apply' cannot apply this "
            "result"
        )
    path = out.with_name(spec["file"])
    updates = sum(len(e.updates) for e in result.trajectory.rounds) if result.trajectory else 0
    return (
        f"apply file: {path} ({path.stat().st_size / 1e6:,.1f} MB: the model"
        + (f" and {updates} client update(s) of its trajectory" if updates else "")
        + "): 'fedunlearn apply' consumes it; 'fedunlearn forget' deletes it when it holds a "
        "forgotten client's update and lies in the run directory; --no-apply-file skips it"
    )


def cost_lines(summary: dict[str, Any]) -> list[str]:
    """The costs of an ``unlearn`` result: the method's, the receipt's, the saving vs Retrain."""
    c = summary["costs"]
    lines = [
        f"method: {c['wall_seconds']:.1f} s wall (server {c.get('server_seconds', 0.0):.1f} s, "
        f"client training {c.get('client_train_seconds', 0.0):.1f} s; per-round evaluation "
        f"{c.get('evaluation_seconds', 0.0):.1f} s not counted), {c['client_epochs']:,} client "
        f"epochs, {c['history_bytes_read'] / 1e6:,.1f} MB of history read, "
        f"{c['bytes_communicated'] / 1e6:,.1f} MB communicated"
    ]
    cost = (summary.get("verification") or {}).get("cost") or {}
    if cost.get("wall_seconds") is not None:
        lines.append(
            f"receipt: {cost['wall_seconds']:.1f} s wall, {int(cost.get('client_epochs', 0)):,} "
            "client epochs of reference training (apart from the method's)"
        )
    retrain = summary.get("retrain")
    if retrain:
        epochs, seconds = retrain["client_epochs"], retrain["wall_seconds"]
        lines.append(
            f"vs Retrain in this run ({epochs:,} client epochs, {seconds:.1f} s): epochs saved "
            f"{_times(epochs, c['client_epochs'])}, time saved {_times(seconds, c['wall_seconds'])}"
        )
    return lines


def _times(reference: float, value: float) -> str:
    return f"{reference / value:.2f}x" if value else "n/a"


def _queued_for_app(
    run_dir: Path,
    ids: list[int],
    kind: str,
    method: str,
    param: list[str],
    out: Path,
    samples: bool,
) -> bool:
    """Queue the request of a run recorded from a Flower app for the app; False for others.

    Its clients keep their data, so only the app (``flwr run``) can serve it
    (``fedunlearn.runs.app_requests``).
    """
    from fedunlearn.runs.app_requests import AppRequest, queue_request, serving
    from fedunlearn.runs.rundir import open_meta

    meta = open_meta(run_dir)
    how = serving(meta, run_dir)
    if how is None:
        return False
    if samples:
        raise ConfigError(
            "this run was recorded from a Flower app whose clients keep their data: "
            "sample-level requests are not served over an app yet; forget the client instead"
        )
    from fedunlearn.unlearn import make_method

    params = parse_params(param)
    make_method(method, params)  # an unknown method or parameter is refused here, not there
    request = AppRequest(tuple(ids), method, params, kind, str(out.resolve()))
    queue = queue_request(run_dir, request)
    console.print(
        f"{run_dir} was recorded from the Flower app '{how['app']}': its clients keep their "
        f"data, so the app serves the request. Queued: {kind} {list(request.forget)} with "
        f"{method} (in {queue}); the result will be {request.out}.",
        soft_wrap=True,
    )
    console.print(f"serve it now, from the app's directory: {how['command']}", soft_wrap=True)
    return True


@app.command()
@_friendly_errors
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
    thresholds: ThresholdsFileOption = None,
    threshold: ThresholdOption = None,
    client_test: ClientTestOption = True,
    distance_retrains: DistanceRetrainsOption = 0,
    explain: ExplainOption = False,
) -> None:
    """Run several methods on a run, verify each, write results.json/csv/md and PNG plots.

    Exit code 1 when any method other than the 'none' control leaves the influence.
    """
    ensure_writable_output(out, "directory")
    params = _read_params_file(params_file)
    ids, kind = parse_forget(forget, run_dir)
    from fedunlearn.cli import receipt

    limits = receipt.load_thresholds(thresholds, threshold)
    doc = _compare(
        run_dir,
        ids,
        kind,
        methods_,
        params,
        seed,
        quiet=as_json,
        limits=limits,
        client_test=client_test,
        distance_retrains=distance_retrains,
    )
    from fedunlearn.report import plot_results, write_results

    write_results(doc, out)
    plot_results(doc, out)
    if as_json:
        print(json.dumps(doc, indent=2))
    else:
        _print_results(doc)
        receipt.print_verdicts(doc, explain=explain)
        console.print(f"wrote {out}/results.json, results.csv, results.md and plots")
    if receipt.comparison_exit_code(doc):
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


def _compare(
    run_dir: Path,
    ids: list[int],
    kind: str,
    methods_: str,
    params: dict[str, Any],
    seed: int,
    *,
    quiet: bool,
    client_test: bool = True,
    limits: Any = None,
    distance_retrains: int = 0,
) -> dict[str, Any]:
    from fedunlearn.experiments import compare_methods

    names = methods_for(run_dir) if methods_ == "all" else [m.strip() for m in methods_.split(",")]
    from fedunlearn.cli import receipt

    with receipt.RoundProgress(enabled=not quiet) as progress:
        return compare_methods(
            run_dir,
            ids,
            names,
            params=params,
            kind=kind,
            seed=seed,
            thresholds=limits,
            progress=progress,
            client_test=client_test,
            distance_retrains=distance_retrains,
        )


@app.command()
@_friendly_errors
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


@app.command()
@_friendly_errors
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
    summary = _train(config, out, resume, quiet=False)
    _print_summary(summary, out)
    ids = summary["malicious_clients"]
    console.print(f"Removing the backdoored clients {ids} with every registered method ...")
    doc = _compare(out, ids, "recover", "all", {}, 0, quiet=False)
    results = out / "comparison"
    write_results(doc, results)
    plot_results(doc, results)
    _print_results(doc)
    console.print(receipt.LEGEND, style="dim")
    receipt.print_verdicts(doc, explain=explain)
    from fedunlearn.cli.deletion_ready import run_deletion_ready_demo

    run_deletion_ready_demo(out, console)
    console.print(f"Tables and plots in {results}/ ; inspect the run with: fedunlearn info {out}")


def _check_earlier_demo(out: Path, config: RunConfig) -> None:
    """Refuse to continue a run in ``out`` that is not this demo."""
    from fedunlearn.config import dump_config
    from fedunlearn.runs import load_run_config
    from fedunlearn.runs.rundir import config_differences

    earlier = load_run_config(out)
    if dump_config(earlier) != dump_config(config):
        fail(
            f"--out {out} holds another run ({config_differences(config, earlier)}; demo vs "
            f"that run); choose another --out, or remove {out} to start the demo afresh"
        )


def _register_subcommands() -> None:
    from fedunlearn.cli import auditor, plan, receipt
    from fedunlearn.cli.central import central_command
    from fedunlearn.plugins import cli_hooks

    receipt.register(app)  # audit
    plan.register(app)  # plan
    auditor.register(app)  # check-receipt
    app.command(name="central")(central_command)
    for register in cli_hooks():  # each installed plugin's commands (Plugin.cli)
        register(app)


_register_subcommands()


def main() -> None:  # pragma: no cover - console entry point
    """Run the CLI."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    install_warning_format()
    app(prog_name="fedunlearn")


if __name__ == "__main__":  # pragma: no cover
    main()
    sys.exit(0)
