"""Hand-made receipt evidence for the rule tests: flat keywords -> the typed ``Evidence``.

The rule tests describe a case in a few flat words (``retrain=...``, ``attackers_forgotten=2``,
``clean_path=...``); ``flat_evidence`` sorts them into the parts the rules read
(``Controls``, ``Attack``, ``Claims`` and the per-rule measurements).
"""

from __future__ import annotations

from typing import Any

from fedunlearn.eval.receipt import Attack, Claims, Controls, Evidence

_CONTROLS = {
    "original": "original",
    "noisy_original": "noisy",
    "noise_std": "noise_std",
    "retrain": "retrain",
    "retrain_gap": "retrain_gap",
    "initial_gap": "initial_gap",
    "clean_asr": "clean_asr",
    "clean_path": "clean_less",
    "clean_less": "clean_less",
    "clean_more": "clean_more",
    "private_reference": "private_reference",
}
_ATTACK = {
    "request_kind": "request_kind",
    "clients": "clients",
    "backdoor": "backdoor",
    "attack_kind": "kind",
    "attackers_forgotten": "attackers_forgotten",
    "clients_forgotten": "clients_forgotten",
    "attackers_total": "attackers_total",
    "private_run": "private_run",
}
_CLAIMS = {
    "bound": "bound",
    "warnings": "warnings",
    "warnings_available": "warnings_available",
    "lineage": "lineage",
}
_OWN = ("client_membership", "markers", "distance_band", "deletion")


def flat_evidence(row: Any, **kw: Any) -> Evidence:
    """Return ``Evidence`` of ``row`` from flat keywords (unknown ones raise TypeError)."""
    parts: dict[str, dict[str, Any]] = {"controls": {}, "attack": {}, "claims": {}, "own": {}}
    for key, value in kw.items():
        if key in _CONTROLS:
            parts["controls"][_CONTROLS[key]] = value
        elif key in _ATTACK:
            parts["attack"][_ATTACK[key]] = value
        elif key in _CLAIMS:
            parts["claims"][_CLAIMS[key]] = value
        elif key in _OWN:
            parts["own"][key] = value
        else:
            raise TypeError(f"flat_evidence: unknown keyword {key!r}")
    if parts["controls"].get("clean_less") is None:
        parts["controls"].pop("clean_less", None)
    return Evidence(
        row=row,
        controls=Controls(**parts["controls"]),
        attack=Attack(**parts["attack"]),
        claims=Claims(**parts["claims"]),
        **parts["own"],
    )
