"""A receipt's per-client entries on a living run: every forgotten client, new and earlier.

On a run with applied results (docs/lifecycle.md) a request forgets its new clients and every
client removed before. ``client_entries`` turns one receipt into one entry per forgotten
client, each saying what this receipt shows about that client:

- **influence.** A *new* client's influence is judged by the receipt's checks that speak about
  it: the backdoor and poisoning checks for an attacker, the membership, client-level and
  distance checks for every client (these are measured on the whole forgotten set). An
  *earlier* client was removed by an applied result, so the run's current model (the checks'
  negative control, "original") no longer carries its influence: no check of this receipt has
  power for it (nor can a check that flags the whole set be attributed to it). Its entry is
  ``not_shown`` with that reason and names the event and the digest of the receipt that did
  show it, unless the result was trained afresh from M_0 with an exact lineage (Retrain:
  ``removed`` by construction; an exact lineage over an applied approximate trajectory is not
  enough);
- **store.** The client's update bytes still stored, its deleted payloads (the deletion
  records, including those an ``apply`` recorded) and the deleted updates the store could
  still rebuild (``history.store.reconstruction``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedunlearn.unlearn import Verification
from fedunlearn.unlearn.receipt import influence_basis, influence_verdict
from fedunlearn.unlearn.views import RunView

__all__ = ["client_entries"]

_EVERY_CLIENT = frozenset({"membership", "client_membership", "distance"})
_ATTACKER = frozenset({"backdoor", "poisoning"})


def _influence(
    receipt: Verification, names: frozenset[str]
) -> tuple[str, str, str, list[dict[str, str]]]:
    checks = [c for c in receipt.checks if c.aspect != "influence" or c.name in names]
    verdict, reason = influence_verdict(
        checks, receipt.lineage, receipt.references, receipt.detection_limit
    )
    basis = influence_basis(checks, receipt.lineage)[1]
    shown = [
        {"check": c.name, "verdict": c.verdict}
        for c in checks
        if c.aspect == "influence" and c.verdict != "n/a"
    ]
    return verdict, reason, basis, shown


def _store(client: int, deletion: Mapping[str, Any] | None) -> dict[str, Any]:
    if deletion is None:
        return {"status": "not read"}
    held = int((deletion.get("bytes_held") or {}).get(client, 0))
    mine = [r for r in deletion.get("records") or [] if int(r.get("client_id", -1)) == client]
    deleted = sum(int(r.get("num_payloads", 0)) for r in mine)
    rebuildable = [r for r in deletion.get("reconstructible") or [] if int(r[1]) == client]
    status = "rebuildable" if rebuildable else "held" if held else "deleted" if mine else "none"
    return {
        "status": status,
        "bytes_held": held,
        "deleted_payloads": deleted,
        "reconstructible": rebuildable,
    }


def _exact(receipt: Verification) -> bool:
    """An exact lineage that started from M_0 (one model's bytes read may be any model's)."""
    lineage = receipt.lineage
    return (
        lineage is not None and lineage.get("kind") == "exact" and lineage.get("start_round") == 0
    )


def client_entries(
    run: RunView,
    receipt: Verification,
    deletion: Mapping[str, Any] | None,
    forget: frozenset[int],
    *,
    history_bytes_read: int | None = None,
) -> list[dict[str, Any]]:
    """Return one entry per forgotten client of a receipt (see the module docstring).

    Args:
        run: The run as the session opened it (its events, applied and attacking clients).
        receipt: The receipt of a model for the (cumulative) request ``forget``.
        deletion: The store's deletion evidence for ``forget`` (``Verifier.deletion``).
        forget: The request's full forget set.
        history_bytes_read: The payload bytes the method read from the store. A result with
            an exact lineage that read nothing but M_0 (Retrain: fresh training from M_0)
            is free of an earlier client by construction; any other read may carry an
            approximate earlier result's residue (an applied trajectory's estimated rounds).

    Returns:
        ``[{"client", "request": "new" | "earlier", "role": "attacker" | "honest",
        "influence", "influence_reason", "basis", "checks", "store", "removed_by"}]`` by
        client id; ``basis`` is the influence's basis code (``influence_basis``, or
        ``no_control`` / ``not_attributable`` for an earlier client); ``removed_by`` (earlier
        clients only) names the applied event.
    """
    events = run.store.events()
    initial_bytes = run.initial_params.numel() * run.initial_params.element_size()
    fresh = history_bytes_read is not None and history_bytes_read <= initial_bytes
    entries = []
    for client in sorted(forget):
        attacker = client in run.malicious
        names = _EVERY_CLIENT | (_ATTACKER if attacker else frozenset())
        verdict, reason, basis, shown = _influence(receipt, names)
        entry: dict[str, Any] = {
            "client": client,
            "request": "earlier" if client in run.applied else "new",
            "role": "attacker" if attacker else "honest",
        }
        if client in run.applied:
            event = next(e for e in events if client in e.forget)
            entry["removed_by"] = {
                "generation": event.generation,
                "method": event.method,
                "receipt_sha256": event.receipt_sha256,
                "result_sha256": event.result_sha256,
            }
            if not (fresh and _exact(receipt)):
                flagged = (
                    "a check flags the whole forgotten set, which this receipt cannot attribute "
                    "to it; "
                    if verdict == "remains"
                    else ""
                )
                verdict = "not_shown"
                basis = "not_attributable" if flagged else "no_control"
                reason = flagged + (
                    f"no negative control: client {client} was removed by generation "
                    f"{event.generation} ({event.method}), so the run's current model, the checks' "
                    "control, no longer carries its influence and no check here has power for it; "
                    f"the receipt of that request (sha256 {event.receipt_sha256[:12] or 'none'}) "
                    "is its evidence"
                )
        entry.update(
            influence=verdict,
            influence_reason=reason,
            basis=basis,
            checks=shown,
            store=_store(client, deletion),
        )
        entries.append(entry)
    return entries
