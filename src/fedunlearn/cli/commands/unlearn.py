"""``fedunlearn unlearn``: one method on a run, its receipt, the result JSON and apply file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from fedunlearn.cli.common import (
    FinishedRunArg,
    ForgetOption,
    ForgetSamplesOption,
    cli_errors,
    describe_os_error,
    ensure_writable_output,
    fail,
    parse_forget,
    parse_forget_samples,
    parse_params,
)
from fedunlearn.cli.options import DEFAULT_RECEIPT_FLAGS, ReceiptFlags, receipt_options
from fedunlearn.cli.printing import console, human_bytes
from fedunlearn.cli.threads import threads_line
from fedunlearn.errors import ConfigError

__all__ = ["cost_lines", "register", "unlearn"]


@receipt_options()
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
    receipt: ReceiptFlags = DEFAULT_RECEIPT_FLAGS,
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
    from fedunlearn.cli.receipt import RoundProgress, exit_code, print_verification
    from fedunlearn.experiments import unlearn_one

    options = receipt.options()
    with RoundProgress() as progress:
        result, summary = unlearn_one(
            run_dir,
            ids,
            method,
            params=parse_params(param or []),
            kind=kind,
            receipt=options,
            progress=progress,
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
    for line in cost_lines(summary, retrain_asked=receipt.reference == "retrain"):
        console.print(f"  {line}", highlight=False)
    console.print(f"  {threads_line(summary.get('torch_threads'))}", highlight=False)
    print_verification(
        summary["verification"], title=f"{method} verification", explain=receipt.explain
    )
    if exit_code(summary["verification"]):
        raise typer.Exit(1)


def _apply_file_line(out: Path, spec: dict[str, Any], result: Any) -> str:
    """Say where the apply file is and how large (or that none was written)."""
    if spec["file"] is None:
        return (
            "apply file: none written (--no-apply-file): 'fedunlearn apply' cannot apply this "
            "result"
        )
    path = out.with_name(spec["file"])
    updates = result.trajectory.num_updates() if result.trajectory else 0
    return (
        f"apply file: {path} ({path.stat().st_size / 1e6:,.1f} MB: the model"
        + (f" and {updates} client update(s) of its trajectory" if updates else "")
        + "): 'fedunlearn apply' consumes it; 'fedunlearn forget' deletes it when it holds a "
        "forgotten client's update and lies in the run directory; --no-apply-file skips it"
    )


def cost_lines(summary: dict[str, Any], *, retrain_asked: bool = False) -> list[str]:
    """The costs of an ``unlearn`` result: the method's, the receipt's, the saving vs Retrain.

    ``retrain_asked`` (``--reference retrain``): say so when no Retrain was trained.
    """
    c = summary["costs"]
    lines = [
        f"method: {c['wall_seconds']:.1f} s wall (server {c.get('server_seconds', 0.0):.1f} s, "
        f"client training {c.get('client_train_seconds', 0.0):.1f} s; per-round evaluation "
        f"{c.get('evaluation_seconds', 0.0):.1f} s not counted), {c['client_epochs']:,} client "
        f"epochs, {human_bytes(c['history_bytes_read'])} of history read, "
        f"{human_bytes(c['bytes_communicated'])} communicated"
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
            f"vs Retrain in this run ({epochs:,} client epochs, {seconds:.1f} s of method time): "
            f"epochs saved {_times(retrain.get('epoch_saving_vs_retrain'))}, time saved "
            f"{_times(retrain.get('time_saving_vs_retrain'))} (the result JSON's 'retrain')"
        )
    elif retrain_asked:
        exact = (summary.get("lineage") or {}).get("kind") == "exact"
        why = "the result's lineage is exact, its receipt needs none" if exact else "none trained"
        lines.append(
            f"vs Retrain: not measured ({why}); 'fedunlearn compare RUN --forget IDS --methods "
            f"{summary.get('method', 'METHOD')}' measures the saving against a Retrain"
        )
    return lines


def _times(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}x"


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


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command()(cli_errors(unlearn))
