"""``fedunlearn plan CONFIG``: what deletions will cost, before training; and ``info``'s summary.

Builds the config's federation (data and model, no training) for each client's N_k and the
model's size, calls ``fedunlearn.runs.plan.plan_deletions`` and prints one screen: the run's
K, E, b, R, M, ρ, the expected cost of a client, a sample and a batch request against Retrain,
of N requests in sequence, and the break-even (docs/deletion_ready.md, "Planner").
``readiness_lines`` renders the "deletion readiness" rows of ``fedunlearn info``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from fedunlearn.cli.common import DataDirOption, cli_errors
from fedunlearn.cli.printing import human_bytes
from fedunlearn.errors import ConfigError

if TYPE_CHECKING:
    from fedunlearn.runs.plan import Plan, RequestCost
    from fedunlearn.runs.plan.storage import StoragePrediction

__all__ = ["plan_command", "readiness_rows", "register"]

console = Console(soft_wrap=True, highlight=False)


def _pct(value: float) -> str:
    return f"{100 * value:.3g} %"


def _opt(value: float | None, fmt: str = ".3f") -> str:
    return "-" if value is None else format(value, fmt)


def _samples(count: int) -> str:
    return "1 sample" if count == 1 else f"{count} samples"


def _row(label: str, cost: RequestCost) -> str:
    p, bound = _opt(cost.recompute_probability), _opt(cost.bound_probability, ".2f")
    return (
        f"  {label:<31} {p:>9} {bound:>6} {cost.expected_rounds:>9.1f} "
        f"{_pct(cost.cost_ratio):>10} {human_bytes(cost.expected_bytes):>9}"
    )


def plan_lines(plan: Plan, source: str) -> list[str]:
    """Return the plan as at most ~20 lines of text."""
    tv = plan.sampling == "tv_stable"
    draws = "K" if tv else "n"
    local = f"E = {plan.local_steps}, b = {plan.batch_size}" if tv else "local epochs"
    shards = f", S = {plan.shards} shards" if plan.shards > 1 else ""
    lines = [
        f"Deletion plan of {source} ({plan.sampling} sampling; before training)",
        f"  M = {plan.num_clients} clients{shards}, {draws} = {plan.draws_per_round} per round "
        f"({plan.distinct_per_round:.3g} distinct), {local}, R = {plan.rounds}; requests after "
        f"round {plan.after_round}",
        f"  rho_C = {plan.rho_client:.3g}"
        + (
            f", rho_S = {plan.rho_sample_worst:.3g} (worst client {plan.worst_client})"
            if plan.rho_sample_worst is not None
            else ""
        )
        + (
            f"; one model transfer {human_bytes(plan.model_bytes)}"
            if plan.model_bytes is not None
            else ""
        ),
        "",
        f"  {'request':<31} {'P(recomp)':>9} {'bound':>6} {'E[rounds]':>9} {'vs Retrain':>10}"
        f" {'traffic':>9}",
        _row("1 client", plan.client),
        _row(f"{_samples(plan.sample.items)}, random owner", plan.sample),
    ]
    # unequal N_k: the smallest client's samples are used more often
    worst, typical = plan.sample_worst, plan.sample
    if (worst.recompute_probability or 0) - (typical.recompute_probability or 0) > 1e-9:
        label = f"{_samples(plan.sample.items)} of client {plan.worst_client} (worst)"
        lines.append(_row(label, plan.sample_worst))
    lines.append(_row(f"{plan.batch.items} clients at once", plan.batch))
    if plan.tv_stable_client is not None:
        label = f"1 client if tv_stable (K = {plan.tv_stable_draws})"
        lines.append(_row(label, plan.tv_stable_client))
    seq = plan.sequence
    lines += [
        "",
        f"  {seq.requests} single-client request(s), one at a time: "
        f"{seq.expected_recomputations:.2f} expected recomputations "
        f"(paper's bound {seq.bound_recomputations:.3g}), "
        f"{seq.expected_rounds:.1f} rounds, {_pct(seq.cost_ratio)} of {seq.requests} Retrain(s)",
    ]
    if seq.break_even is not None:
        lines.append(
            f"  break-even: after {seq.break_even} single-client requests served one at a time, "
            "they have cost one Retrain that removes them all (batch requests that can wait)"
        )
    else:
        lines.append("  break-even: no number of requests served one at a time reaches a Retrain")
    if plan.batch_break_even is not None:
        lines.append(
            f"  one request of {plan.batch_break_even}+ clients saves less than 10 % of Retrain"
        )
    if not tv:
        lines.append(
            "  fraction sampling: a client's first participation is geometric, and a request "
            "recomputes from it (training.sampling: tv_stable draws with replacement instead)"
        )
    return lines


@cli_errors
def plan_command(
    config_path: Annotated[Path, typer.Argument(metavar="CONFIG", help="YAML run config")],
    requests: Annotated[
        int, typer.Option(help="single-client requests served one at a time (N)")
    ] = 1,
    batch: Annotated[
        int | None,
        typer.Option(help="clients forgotten together in one request (default: 10, at most M-1)"),
    ] = None,
    samples: Annotated[
        int, typer.Option(help="samples of one client deleted together in one request")
    ] = 1,
    after_round: Annotated[
        int | None, typer.Option(help="requests arrive after this round (default: the last)")
    ] = None,
    data_dir: DataDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
) -> None:
    """Predict, before training, what deletion requests will recompute (deletion-ready runs)."""
    from fedunlearn.config import load_config
    from fedunlearn.runs import build_setup
    from fedunlearn.runs.plan import PlanInputs, plan_deletions
    from fedunlearn.runs.plan.storage import predict_storage

    config = load_config(config_path, {"data.data_dir": str(data_dir)} if data_dir else None)
    rounds = config.training.rounds
    if after_round is not None and not 1 <= after_round <= rounds:
        raise ConfigError(
            f"--after-round must be in 1..{rounds} (training.rounds); got {after_round}"
        )
    if config.data.num_clients < 2:
        raise ConfigError("plan needs data.num_clients >= 2 (one client must remain)")
    batch = min(10, config.data.num_clients - 1) if batch is None else batch
    for name, value in (("--requests", requests), ("--batch", batch), ("--samples", samples)):
        if value < 1:
            raise ConfigError(f"{name} must be >= 1; got {value}")
    if batch >= config.data.num_clients:
        raise ConfigError(
            f"--batch {batch} must be below data.num_clients ({config.data.num_clients}): "
            "one client must remain"
        )
    setup = build_setup(config)
    try:
        sizes = [len(setup.federation.client_data[c]) for c in setup.federation.client_ids]
        num_params = int(setup.initial_params.numel())
    finally:
        setup.close()
    if samples >= min(sizes):
        raise ConfigError(
            f"--samples {samples} is not below the smallest client's {min(sizes)} samples; "
            "deleting a whole client is a client request"
        )
    inputs = PlanInputs.from_config(config, sizes, num_params)
    plan = plan_deletions(
        inputs, requests=requests, batch_clients=batch, samples=samples, after_round=after_round
    )
    storage = predict_storage(
        config.history.policy,
        rounds=rounds,
        updates_per_round=plan.distinct_per_round,
        num_params=num_params,
        every=config.history.every,
        expectation=plan.sampling == "tv_stable",
        update_bytes=2 if config.history.encoding == "float16" else 4,
        shards=config.training.shards,
    )
    if as_json:
        print(json.dumps({**plan.to_dict(), "storage": storage.to_dict()}, indent=2))
        return
    for line in plan_lines(plan, str(config_path)):
        console.print(escape(line))
    console.print(escape(storage_line(storage)))


def storage_line(storage: StoragePrediction) -> str:
    """One line: what the history store will hold (runs/plan/storage.py)."""
    selective = storage.policy not in ("all", "every", "none")
    how = "at most " if selective else ("" if storage.exact else "about ")
    return (
        f"history store (policy {storage.policy}): {how}{storage.payload_bytes / 1e6:,.3g} MB of "
        f"payloads, {storage.per_round_bytes / 1e6:,.3g} MB per round (plus SQLite's own pages; "
        "rejected uploads not counted)"
    )


def readiness_rows(readiness: dict[str, Any] | None) -> list[list[str]]:
    """Rows of ``fedunlearn info``: what a client request would recompute now, vs the planner."""
    if not readiness:
        return []
    n, rounds = readiness["clients"], readiness["rounds"]
    never = readiness["never_drawn"]
    listed = ", ".join(map(str, never[:8])) + (", ..." if len(never) > 8 else "")
    predicted = readiness.get("predicted") or {}
    p_pred = predicted.get("recompute_probability")
    e_pred = predicted.get("expected_rounds")
    first = readiness["first_drawn_round"]
    sample = ", ".join(f"{c}: {r if r is not None else '-'}" for c, r in list(first.items())[:6])
    return [
        [
            "deletion readiness",
            f"{len(never)} of {n} clients never drawn ({listed or 'none'}); a request for one "
            "of them recomputes nothing",
        ],
        [
            "  client request now",
            f"recomputes {readiness['mean_rounds_to_recompute']:.1f} of {rounds} rounds on "
            f"average, {_pct(readiness['recompute_rate'])} of clients any"
            + (
                f" (planner: {e_pred:.1f} rounds, P {p_pred:.3f})"
                if e_pred is not None and p_pred is not None
                else ""
            ),
        ],
        [
            "  first drawn round",
            sample + (", ..." if len(first) > 6 else "") + " (--json: every client)",
        ],
    ]


def register(app: typer.Typer) -> None:
    """Add ``plan`` to the ``fedunlearn`` command."""
    app.command(name="plan")(plan_command)
