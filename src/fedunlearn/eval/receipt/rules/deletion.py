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


# Listed signs of damage: (code, where the list is in the evidence, the facts' name for it).
_STORE_SIGNS = (
    ("readable", ("read_back", "readable"), "pairs"),
    ("rebuildable", ("reconstructible",), "pairs"),
    ("unrecorded", ("unrecorded",), "pairs"),
    # the seeded sampler drew them, their rows are gone, no record says why
    ("rows_missing", ("participation", "missing"), "pairs"),
    ("models_unrecorded", ("missing_models",), "models"),
)
_KEPT_SIGNS = (
    ("scalars_kept", ("scalars_kept",), "pairs"),
    ("result_files", ("result_files",), "files"),
)


def _first_listed(
    d: Mapping[str, Any], signs: tuple[tuple[str, tuple[str, ...], str], ...]
) -> tuple[str, dict[str, Any]] | None:
    """The first of ``signs`` whose list is not empty, as (code, its count and first three)."""
    for code, path, name in signs:
        value: Any = d
        for key in path:
            value = (value or {}).get(key)
        listed = list(value or [])
        if listed:
            return code, {"count": len(listed), name: listed[:3]}
    return None


def _damage(d: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The first sign that a deletion did not hold, as (code, facts), or None."""
    found = _first_listed(d, _STORE_SIGNS)
    if found is not None:
        return found
    page_scan = d.get("page_scan")
    if isinstance(page_scan, Mapping) and int(page_scan.get("fragments_found") or 0) > 0:
        return "fragments", {"count": int(page_scan["fragments_found"])}
    scan = d.get("scan")
    if isinstance(scan, Mapping) and scan.get("ok") is False:
        return "scan_failed", {"why": str(scan.get("reason") or "the page scan found it")}
    return _first_listed(d, _KEPT_SIGNS)


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
