"""The receipt of an unlearning result: checks with verdicts, and a method's certified bound.

A ``Verification`` is what verifying one model against one request found: a tuple of ``Check``
values (each a measured value, the reference it was judged against, the threshold, the check's
measured power and a verdict ``pass``, ``warn``, ``fail``, ``inconclusive`` or ``n/a``, with one
sentence saying why), and three separate verdicts: **influence** (``removed`` by construction only,
``not_detected`` with the receipt's detection limit, ``not_shown``, ``remains``: from the checks
with power and the result's lineage), **utility** (``ok``,
``degraded``, ``unknown``) and **store** (``deleted``, ``held``, ``damaged``, ``unknown``). The
summary line and the command-line exit codes follow the influence verdict; ``verdict`` (the
worst check) is kept for tables.
These are plain frozen values so that ``UnlearnResult`` can carry one; the checks themselves are
computed in ``fedunlearn.eval`` (above this layer), and ``docs/verification.md`` documents them.

``BoundReport`` is how a method states a certified bound on its own distance to a retrained
model (Crab's Theorem 1, Starfish's Theorem 1): ``Details.certified_bound()`` returns one, or
None when the method certifies nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from fedunlearn.errors import ConfigError

__all__ = [
    "INFLUENCE_VERDICTS",
    "VERDICTS",
    "BoundReport",
    "Check",
    "Verdict",
    "Verification",
    "influence_basis",
    "influence_verdict",
    "overall_verdict",
]

Verdict = Literal["pass", "warn", "fail", "inconclusive", "n/a"]
VERDICTS: tuple[str, ...] = ("pass", "warn", "fail", "inconclusive", "n/a")
_SEVERITY = {"n/a": 0, "pass": 1, "inconclusive": 2, "warn": 3, "fail": 4}
Aspect = Literal["influence", "utility", "store", "method"]
Influence = Literal["removed", "not_detected", "not_shown", "remains"]
INFLUENCE_VERDICTS: tuple[str, ...] = ("removed", "not_detected", "not_shown", "remains")


def _json_number(value: Any) -> Any:
    """Return ``value`` with non-finite floats as None (JSON has no NaN or inf)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_number(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_number(v) for v in value]
    return value


def _json_fields(record: Any) -> dict[str, Any]:
    """Return a dataclass's fields by name, in order, JSON-ready (``_json_number``)."""
    return _json_number({f.name: getattr(record, f.name) for f in fields(record)})


@dataclass(frozen=True)
class BoundReport:
    """A certified upper bound on the distance between a method's model and a retrained model.

    Attributes:
        name: What the bound is, e.g. ``"Crab Theorem 1 (B_safe)"``.
        bound: The bound's value (same units as ``observed``: L2 distance of flat parameters).
        observed: The distance the bound is about, measured by the method against the model the
            theorem compares with; None if the method did not measure it (the receipt then uses
            the distance to Retrain when ``reference`` is ``"retrain"`` and one is available).
        reference: The model the distance is to, in words (``"retrain"`` for the full Retrain).
        note: Assumptions worth knowing (e.g. "convexity assumed; illustrative on an MLP").
    """

    name: str
    bound: float
    observed: float | None = None
    reference: str = "retrain"
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict of every field."""
        return _json_fields(self)


@dataclass(frozen=True)
class Check:
    """One check of a receipt.

    Attributes:
        name: Stable key (``backdoor``, ``membership``, ``distance``, ``bound``, ``utility``,
            ``deletion``, ``method_warnings``).
        title: Short human title.
        verdict: ``pass``, ``warn``, ``fail``, ``inconclusive`` (the check cannot tell its
            negative control, the original model, from a model without the forgotten clients,
            or flags its positive control, Retrain) or ``n/a``.
        value: The measured value the verdict is based on (None for ``n/a``).
        reference: The value(s) it is judged against, by name (``{"original": .., "retrain": ..}``).
        threshold: The thresholds applied, by name (``{"warn": .., "fail": ..}``).
        reason: One sentence saying why, for every verdict other than ``pass`` (and a short
            statement for a pass).
        scope: ``model`` (a property of the judged model) or ``store`` (of the run's history
            store, the same for every model of a request).
        evidence: Further measured numbers (per attack, per client, ...).
        aspect: Which separate verdict the check feeds: ``influence`` (whether the forgotten
            clients' influence is gone), ``utility``, ``store`` or ``method`` (the method's own
            claims: warnings, certified bound).
        power: The check's measured power on its controls (e.g. ``original_flagged``,
            ``separation_se``: the original's distance from the reference in standard errors).
        decisive: Whether a pass of this check can show that the influence is removed (a
            distance can be small for a model that still carries it: not decisive).
        codes: Why the verdict is what it is, as stable codes (``survives``, ``no_power``,
            ...); ``reason`` is their rendering (docs/verification.md lists them).
    """

    name: str
    title: str
    verdict: Verdict
    value: float | None = None
    reference: dict[str, Any] = field(default_factory=dict)
    threshold: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    scope: Literal["model", "store"] = "model"
    evidence: dict[str, Any] = field(default_factory=dict)
    aspect: Aspect = "influence"
    power: dict[str, Any] = field(default_factory=dict)
    decisive: bool = True
    codes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ConfigError(f"verdict must be one of {', '.join(VERDICTS)}; got {self.verdict!r}")

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict of every field."""
        return _json_fields(self)


def overall_verdict(checks: tuple[Check, ...] | list[Check]) -> Verdict:
    """Return the worst verdict: ``fail``, else ``warn``, else ``inconclusive``, else ``pass``."""
    worst = max((_SEVERITY[c.verdict] for c in checks), default=0)
    by_severity: dict[int, Verdict] = {4: "fail", 3: "warn", 2: "inconclusive"}
    return by_severity.get(worst, "pass")


#: The code of a check whose pass has power but no stated detection limit (``no_limit``).
NO_LIMIT_CODE = "held_out_null"


HINTS = {
    "retrain_reference": "a Retrain reference (--reference retrain)",
    "client_test": "the client-level membership test",
    "client_test_limit": "the client-level test with references trained per request "
    "(--client-test-references per_request: it states a detection limit)",
    "markers": "participation markers embedded when the client trained",
}


def hints(checks: tuple[Check, ...] | list[Check], references: tuple[str, ...]) -> list[str]:
    """Return what would give evidence about the influence, as codes (``HINTS``)."""
    found = []
    if "retrain" not in references:
        found.append("retrain_reference")
    names = {c.name: c for c in checks}
    client = names.get("client_membership")
    if client is None or client.verdict == "n/a":
        found.append("client_test")
    elif NO_LIMIT_CODE in client.codes:
        found.append("client_test_limit")
    markers = names.get("markers")
    if markers is None or markers.verdict == "n/a":
        found.append("markers")
    return found


def influence_basis(
    checks: tuple[Check, ...] | list[Check], lineage: dict[str, Any] | None
) -> tuple[Influence, str, list[Check]]:
    """Return the influence verdict, its basis (a code) and the checks it rests on.

    Bases: ``exact_lineage`` (removed), ``flagged`` (remains), ``powered_pass``
    (not_detected), ``method_warns``, ``check_warns``, ``no_limit``, ``no_power`` (not_shown).

    ``no_limit``: the only checks that pass with power state no detection limit (the held-out
    client test, code ``held_out_null``: scale-free along Retrain's line, so no step from a
    clean model says how much it misses). ``not_detected`` promises a stated limit
    (docs/verification.md), so such a pass alone is ``not_shown``; a flag is still ``remains``.
    """
    influence = [c for c in checks if c.aspect == "influence"]
    flagged = [c for c in influence if c.verdict == "fail"]
    if lineage is not None and lineage.get("kind") == "exact":
        return "removed", "exact_lineage", flagged
    if flagged:
        return "remains", "flagged", flagged
    shown = [c for c in influence if c.verdict == "pass" and c.decisive]
    warned = [c for c in influence if c.verdict == "warn"]
    # the method itself says its result may keep the influence (e.g. Crab's paper rollback
    # from a model that contains the forgotten clients): checks that see nothing do not
    # overrule it
    method = [c for c in checks if c.aspect == "method" and c.verdict in ("warn", "fail")]
    if shown and not warned and not method:
        return "not_detected", "powered_pass", shown
    if shown and method:
        return "not_shown", "method_warns", method
    if warned:
        return "not_shown", "check_warns", warned
    unlimited = [c for c in influence if c.verdict == "pass" and NO_LIMIT_CODE in c.codes]
    if unlimited and method:
        return "not_shown", "method_warns", method
    if unlimited:
        return "not_shown", "no_limit", unlimited
    return "not_shown", "no_power", []


def limit_words(limit: dict[str, Any] | None) -> str:
    """The detection limit in words (``Verification.detection_limit``)."""
    if not limit or limit.get("lambda") is None:
        why = (limit or {}).get("reason") or "no clean reference model to step from"
        return f"its detection limit was not measured ({why})"
    lam = float(limit["lambda"])
    below = limit.get("not_flagged_at")
    tail = (
        f"; at {below:.2f} it flags nothing, so a model keeping that much may pass unseen"
        if below is not None
        else "; no smaller step was tried"
    )
    skipped = ", ".join(limit.get("not_counted") or {})
    if skipped:
        tail += f"; {skipped} is not counted: it states no detection limit"
    return (
        f"detection limit: the receipt flags a model keeping {lam:.2f} of the original's offset "
        f"from {limit.get('clean', 'Retrain')} (lambda in clean + lambda (original - clean); "
        f"flagged by {', '.join(limit.get('by') or ['?'])}){tail}"
    )


def influence_verdict(
    checks: tuple[Check, ...] | list[Check],
    lineage: dict[str, Any] | None,
    references: tuple[str, ...] = ("original",),
    limit: dict[str, Any] | None = None,
) -> tuple[Influence, str]:
    """Return the influence verdict and one sentence saying why.

    ``removed``: only by construction, when the lineage is ``exact``. ``remains``: an influence
    check with power flags the model. ``not_detected``: a decisive influence check with power
    (it flags the original) flags nothing and none warns; the sentence states the receipt's
    detection limit (``limit``: the smallest step from a clean model toward the original that
    it flags). ``not_shown``: no check with power, or one warns, or the method warns about its
    own result, or the only check that passes with power states no detection limit
    (``no_limit``); the sentence says what would give evidence.
    """
    verdict, basis, rest = influence_basis(checks, lineage)
    if basis == "exact_lineage":
        reason = "by construction: " + ((lineage or {}).get("reason") or "exact lineage")
        if rest:
            reason += " (note: " + "; ".join(f"{c.title} flags it" for c in rest) + ")"
        return verdict, reason
    if basis == "flagged":
        return verdict, "; ".join(f"{c.title}: {c.reason}" for c in rest)
    if basis == "powered_pass":
        names = ", ".join(c.title for c in rest)
        return verdict, f"no check with power flags it ({names}); {limit_words(limit)}"
    if basis == "method_warns":
        why = "; ".join(f"the method warns: {c.reason}" for c in rest)
    elif basis == "check_warns":
        why = "; ".join(f"{c.title} warns: {c.reason}" for c in rest)
    elif basis == "no_limit":
        names = ", ".join(c.title for c in rest)
        why = (
            f"{names} flags the original but not this model, and states no detection limit "
            "(its null is anchored on Retrain, so no step from a clean model measures what it "
            "misses): its pass does not say how much of the influence could remain"
        )
    else:
        why = "no check with power shows it either way"
    wanted = ", ".join(HINTS[h] for h in hints(checks, references))
    return verdict, f"{why}; evidence would come from {wanted}"


@dataclass(frozen=True)
class Verification:
    """What verifying one model against one request found (the receipt).

    Attributes:
        checks: Every check, in a fixed order (n/a ones included, with the reason).
        references: The reference models the checks used (``original``, and ``retrain`` when
            one was computed or given).
        thresholds: The thresholds in force (``VerificationThresholds`` as a dict).
        subject: What was judged (a method name, or the model file of an audit).
        lineage: The result's lineage (``Lineage.to_dict()``), or None when none was available
            (an audited model without ``--result``).
        assumptions: What the result rests on that no check here can see, as the method
            states it (``details.assumptions``: e.g. Starfish's threat model); empty when the
            method states none or its details were not available.
        cost: The receipt's own cost, apart from the method's: ``wall_seconds`` (all of it:
            ``judging_seconds``, this model's measures and checks, plus ``shared_seconds``, its
            references and setup), ``client_epochs`` (its reference models), ``references``
            (per reference), ``shared_by`` (receipts of one request share the references)
            and ``skipped`` (why nothing was trained: an exact lineage).
        detection_limit: The smallest step ``lambda`` from a clean reference toward the
            original (``clean + lambda (original - clean)``) that the receipt flags, measured on
            interpolations (``lambda``, ``by``: the checks that flag it, ``not_flagged_at``:
            the next step tried, ``measured``: every step and its flags, ``not_counted``: a
            check whose flags do not count, and why); None when not measured (only a
            ``not_detected`` receipt measures it).
    """

    checks: tuple[Check, ...]
    references: tuple[str, ...] = ("original",)
    thresholds: dict[str, Any] = field(default_factory=dict)
    subject: str = ""
    lineage: dict[str, Any] | None = None
    assumptions: tuple[str, ...] = ()
    cost: dict[str, Any] = field(default_factory=dict)
    detection_limit: dict[str, Any] | None = None

    @property
    def verdict(self) -> Verdict:
        """The worst verdict of every check (store checks included); for tables."""
        return overall_verdict(self.checks)

    @property
    def influence(self) -> Influence:
        """The influence verdict: ``removed``, ``not_detected``, ``not_shown`` or ``remains``."""
        return self._influence()[0]

    @property
    def influence_reason(self) -> str:
        """One sentence saying why ``influence`` is what it is."""
        return self._influence()[1]

    @property
    def influence_basis(self) -> str:
        """What the influence verdict rests on, as a code (``influence_basis``)."""
        return influence_basis(self.checks, self.lineage)[1]

    @property
    def deciding(self) -> list[str]:
        """The names of the checks the influence verdict rests on.

        The flags, the passes with power or the warnings; none for an exact lineage.
        """
        _, basis, rest = influence_basis(self.checks, self.lineage)
        return [] if basis == "exact_lineage" else [c.name for c in rest]

    @property
    def hints(self) -> list[str]:
        """What would give evidence about the influence, as codes (``HINTS``)."""
        return hints(self.checks, self.references)

    def _influence(self) -> tuple[Influence, str]:
        return influence_verdict(self.checks, self.lineage, self.references, self.detection_limit)

    @property
    def utility(self) -> str:
        """``ok``, ``degraded`` (the utility check warns or fails) or ``unknown``."""
        found = [c.verdict for c in self.checks if c.aspect == "utility"]
        if any(v in ("warn", "fail") for v in found):
            return "degraded"
        return "ok" if "pass" in found else "unknown"

    @property
    def store(self) -> str:
        """The store verdict: ``deleted``, ``held``, ``damaged`` or ``unknown``.

        ``held``: updates still stored; ``damaged``: a deletion that did not hold (deleted data
        readable, found in the files or rebuildable).
        """
        found = [c for c in self.checks if c.aspect == "store"]
        if not found:
            return "unknown"
        check = found[0]
        if check.verdict == "fail" and check.evidence.get("failure") != "held":
            return "damaged"
        if check.verdict == "pass":
            return "deleted"
        if check.value:  # bytes still held (a warn, or n/a on a recovery request)
            return "held"
        return "unknown"

    @property
    def model_verdict(self) -> Verdict:
        """Overall verdict over the checks of the model alone (``scope == "model"``)."""
        return overall_verdict([c for c in self.checks if c.scope == "model"])

    @property
    def reasons(self) -> tuple[str, ...]:
        """One sentence per failing, warning or inconclusive check, failures first."""
        bad = [c for c in self.checks if c.verdict in ("fail", "warn", "inconclusive")]
        bad.sort(key=lambda c: -_SEVERITY[c.verdict])
        return tuple(f"{c.title}: {c.reason}" for c in bad)

    def check(self, name: str) -> Check:
        """Return the check called ``name``.

        Raises:
            KeyError: if there is no such check.
        """
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no check {name!r}; checks: {', '.join(c.name for c in self.checks)}")

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON block (``docs/results_format.md``, "verification")."""
        influence, why = self._influence()
        return {
            "influence": influence,
            "influence_reason": why,
            "influence_basis": self.influence_basis,
            "deciding": self.deciding,
            "utility": self.utility,
            "store": self.store,
            "lineage": None if self.lineage is None else dict(self.lineage),
            "verdict": self.verdict,
            "model_verdict": self.model_verdict,
            "subject": self.subject,
            "reasons": list(self.reasons),
            "references": list(self.references),
            "checks": [c.to_dict() for c in self.checks],
            "thresholds": _json_number(dict(self.thresholds)),
            "assumptions": list(self.assumptions),
            "cost": _json_number(dict(self.cost)),
            "detection_limit": _json_number(self.detection_limit),
        }
