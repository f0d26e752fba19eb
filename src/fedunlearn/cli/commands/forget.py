"""``fedunlearn forget``: erase clients' stored updates; print the deletion record and evidence."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Annotated

import typer

from fedunlearn.cli.common import RunArg, cli_errors, parse_client_ids
from fedunlearn.cli.printing import console
from fedunlearn.errors import ConfigError

__all__ = ["forget", "register"]


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
    from fedunlearn.history.store.records import format_ids
    from fedunlearn.runs import HISTORY_DIR, forget_clients
    from fedunlearn.runs.forget import result_files_holding, store_evidence

    if vacuum not in ("incremental", "full"):
        raise ConfigError(f"--vacuum must be 'incremental' or 'full'; got {vacuum!r}")
    ids = parse_client_ids(clients)
    files = result_files_holding(run_dir, ids)  # forget_clients deletes them too
    record = forget_clients(run_dir, ids, vacuum=vacuum)  # type: ignore[arg-type]
    with HistoryStore.open(run_dir / HISTORY_DIR) as store:
        evidence = store_evidence(store, ids).evidence  # what a receipt's deletion check reads
    check, rebuildable = evidence.check, [list(p) for p in evidence.reconstructible]
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


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command()(cli_errors(forget))
