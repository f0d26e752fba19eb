"""``fedunlearn central``: centralised unlearning comparison (Mini-Unlearning Tables 1-3).

Parses options, calls ``report.central.run_central`` and writes the tables and plots.

Paper: Huang et al., "Machine Unlearning with Minimal Gradient Dependence for High Unlearning
Ratios", §5. Deviations: ``--methods`` selects by registry name; ``mini_unlearning`` expands to
the k rows (10 steps, 1 pass, 10 passes, T, the L-BFGS variant and the k ablation).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from fedunlearn.cli.common import cli_errors, ensure_writable_output
from fedunlearn.errors import ConfigError, FedUnlearnError

__all__ = ["central_command"]

err_console = Console(stderr=True)


def _floats(text: str, what: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"--{what} must be comma-separated numbers; got {text!r}") from None


@cli_errors
def central_command(
    dataset: Annotated[
        str, typer.Option(help="comma-separated: mnist, digits, covtype_like, ...")
    ] = "digits",
    ratio: Annotated[
        str, typer.Option(help="unlearning ratios, comma-separated")
    ] = "0.05,0.10,0.15",
    methods: Annotated[
        str, typer.Option(help="'all' or comma-separated method names (rows of that method)")
    ] = "all",
    out: Annotated[Path, typer.Option(help="output directory")] = Path("runs/central"),
    seeds: Annotated[str, typer.Option(help="comma-separated run seeds")] = "0",
    data_dir: Annotated[Path | None, typer.Option(help="directory with dataset files")] = None,
    lr: Annotated[float, typer.Option(help="SGD learning rate (paper 0.01)")] = 0.01,
    l2: Annotated[float, typer.Option(help="L2 coefficient (paper 0.005)")] = 0.005,
    batch_size: Annotated[int, typer.Option(help="batch size B")] = 256,
    passes: Annotated[int, typer.Option(help="passes over the data (T = passes * N / B)")] = 10,
    max_train: Annotated[int | None, typer.Option(help="subsample the training set")] = None,
    mia: Annotated[bool, typer.Option(help="run the shadow-model MIA")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="print results.json to stdout")] = False,
) -> None:
    """Compare Mini-Unlearning, DeltaGrad, Certified Removal and Amnesiac against retraining."""
    from fedunlearn.central import available_methods
    from fedunlearn.experiments.central import CentralExperiment, default_methods, run_central
    from fedunlearn.report.central import write_central

    ensure_writable_output(out, "directory")
    try:
        rows = default_methods()
        if methods != "all":
            wanted = [m.strip() for m in methods.split(",") if m.strip()]
            unknown = sorted(set(wanted) - set(available_methods()))
            if unknown:
                raise ConfigError(
                    f"unknown central method(s) {', '.join(unknown)}; available: "
                    f"{', '.join(available_methods())}"
                )
            rows = [r for r in rows if r.method in wanted]
        cfg = CentralExperiment(
            datasets=tuple(d.strip() for d in dataset.split(",") if d.strip()),
            data_dir=None if data_dir is None else str(data_dir),
            max_train=max_train,
            l2=l2,
            sgd={"lr": lr, "batch_size": batch_size, "passes": passes},
            ratios=_floats(ratio, "ratio"),
            seeds=tuple(int(s) for s in seeds.split(",")),
            methods=tuple(rows),
            mia=mia,
        )
        with err_console.status("running", spinner="dots") as status:
            doc = run_central(cfg, progress=lambda msg: status.update(msg))
        paths = write_central(doc, out)
    except FedUnlearnError:
        raise
    except ValueError as err:  # pydantic validation of the options, a malformed --seeds
        raise ConfigError(f"invalid option: {err}") from None
    if as_json:
        typer.echo(json.dumps(doc, default=str))
        return
    # plain text: rich would wrap the Markdown tables at 80 columns when piped
    typer.echo(paths["md"].read_text())
    typer.echo(f"Results in {out}/ (results.json, results.csv, tables.md, plots)")
