"""``fedunlearn info``: what a run stored, its privacy ledger and readiness, checked."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from fedunlearn.cli.common import RunArg, cli_errors
from fedunlearn.cli.plan import readiness_rows
from fedunlearn.cli.printing import GUARANTEE_SHORT, console, headline_epsilon, print_table

__all__ = ["info", "privacy_rows", "register"]


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
        print_info(data, run_dir)
    if data["problems"]:
        raise typer.Exit(1)


def privacy_rows(privacy: dict[str, Any]) -> list[list[str]]:
    """Rows of ``info`` for a run's privacy ledger: mechanism, guarantee, budget, totals."""
    mechanism = privacy.get("mechanism", "client_update")
    totals = privacy["totals"].get(privacy.get("neighbour_relation", "replace_one")) or {}
    delta = privacy["delta"]
    guarantee = privacy.get("epsilon_guarantee")
    rows = [
        [
            "privacy",
            f"mechanism {mechanism} ({GUARANTEE_SHORT.get(mechanism, '')}), "
            + headline_epsilon(
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


def print_info(data: dict[str, Any], run_dir: Path) -> None:
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
        rows.extend(privacy_rows(privacy))
    rows.extend(readiness_rows(data.get("deletion_readiness")))
    check = data["check"]
    how = "every payload" if check["full"] else "models and catalog; 'fedunlearn verify' reads all"
    state = "ok" if not data["problems"] else f"{len(data['problems'])} problem(s)"
    rows.append(["check", f"{state} ({check['payloads_checked']} payloads read: {how})"])
    print_table(f"run {run_dir}", None, rows)
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


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command()(cli_errors(info))
