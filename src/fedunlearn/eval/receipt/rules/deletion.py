"""Rule 8, ``deletion`` (store): the forgotten clients' stored updates are gone and stay gone.

Measure: the store's deletion evidence (``Evidence.deletion``): bytes still held, deletion
records, read-back of every deleted payload, the page scan, updates rebuildable from what the
store keeps.
Grade, in order: a deleted payload readable, an update rebuildable, an update or a model the
catalogue says was kept gone with no deletion record (raw SQL), fragments found by the page
scan, the store's own scan failing, the per-round norm or inner product of a deleted update
still kept, a result file in the run directory holding one: ``fail`` (store ``damaged``);
bytes held on a deletion request: ``deletion_on_forget`` (store ``held``); on a recovery
request: n/a; nothing held: ``pass`` with the records, unless the page scan did not run
(``inconclusive``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedunlearn.eval.receipt.evidence import Evidence
from fedunlearn.eval.receipt.finding import Finding, Rule
from fedunlearn.eval.receipt.thresholds import VerificationThresholds
from fedunlearn.unlearn.receipt import Verdict

__all__ = ["RULE"]

_OPTIONAL = (  # richer evidence a store may add (history.store.evidence.DeletionEvidence)
    "scan",
    "page_scan",
    "reconstructible",
    "unrecorded",
    "missing_models",
    "scalars_kept",
    "result_files",
    "participation",
)


def applies(ev: Evidence) -> Finding | None:
    """n/a when the store was not read."""
    return Finding("n/a", ("not_read",)) if ev.deletion is None else None


def _damage(d: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The first sign that a deletion did not hold, as (code, facts), or None."""
    readable = list((d.get("read_back") or {}).get("readable") or [])
    if readable:
        return "readable", {"count": len(readable), "pairs": readable[:3]}
    rebuilt = list(d.get("reconstructible") or [])
    if rebuilt:
        return "rebuildable", {"count": len(rebuilt), "pairs": rebuilt[:3]}
    unrecorded = list(d.get("unrecorded") or [])
    if unrecorded:
        return "unrecorded", {"count": len(unrecorded), "pairs": unrecorded[:3]}
    drawn = list((d.get("participation") or {}).get("missing") or [])
    if drawn:  # the seeded sampler drew them, their rows are gone, no record says why
        return "rows_missing", {"count": len(drawn), "pairs": drawn[:3]}
    missing = list(d.get("missing_models") or [])
    if missing:
        return "models_unrecorded", {"count": len(missing), "models": missing[:3]}
    page_scan = d.get("page_scan")
    if isinstance(page_scan, Mapping) and int(page_scan.get("fragments_found") or 0) > 0:
        return "fragments", {"count": int(page_scan["fragments_found"])}
    scan = d.get("scan")
    if isinstance(scan, Mapping) and scan.get("ok") is False:
        return "scan_failed", {"why": str(scan.get("reason") or "the page scan found it")}
    kept = list(d.get("scalars_kept") or [])
    if kept:
        return "scalars_kept", {"count": len(kept), "pairs": kept[:3]}
    files = list(d.get("result_files") or [])
    if files:
        return "result_files", {"count": len(files), "files": files[:3]}
    return None


def judge(ev: Evidence, th: VerificationThresholds) -> Finding:
    """Grade what the store shows about the forgotten clients' updates."""
    d = ev.deletion
    assert d is not None
    held = {str(k): int(v) for k, v in (d.get("bytes_held") or {}).items()}
    total = sum(held.values())
    records = list(d.get("records") or [])
    read_back = d.get("read_back") or {}
    evidence: dict[str, Any] = {
        "bytes_held": held,
        "payloads_held": d.get("payloads_held"),
        "records": records,
        "read_back": read_back,
    }
    evidence |= {key: d[key] for key in _OPTIONAL if key in d}
    reference = {"bytes_held": 0}
    damage = _damage(d)
    if damage is not None:
        return Finding("fail", (damage[0],), float(total), reference, {}, evidence, facts=damage[1])
    if total > 0:
        ids = [c for c in sorted(held, key=int) if held[c] > 0]
        facts = {"bytes": total, "ids": ids}
        if ev.attack.request_kind == "recover":
            return Finding(
                "n/a", ("kept_on_recover",), float(total), reference, {}, evidence, facts=facts
            )
        evidence["failure"] = "held"
        verdict: Verdict = th.deletion_on_forget
        return Finding(verdict, ("held",), float(total), reference, {}, evidence, facts=facts)
    facts = {
        "payloads": sum(int(r.get("num_payloads", 0)) for r in records),
        "bytes": sum(int(r.get("size_bytes", 0)) for r in records),
        "when": max((float(r.get("forgotten_at", 0)) for r in records), default=None),
        "refused": int(read_back.get("refused", 0)),
    }
    codes = ["deleted" if records else "never_held"]
    page_scan = d.get("page_scan")
    verdict = "pass"
    if isinstance(page_scan, Mapping) and not page_scan.get("ran", False):
        verdict = "inconclusive"
        codes.append("scan_not_run")
        facts["why"] = page_scan.get("inconclusive_reason") or "it did not run"
    return Finding(verdict, tuple(codes), 0.0, reference, {}, evidence, facts=facts)


RULE = Rule("deletion", "stored data deleted", judge, applies, aspect="store", scope="store")
