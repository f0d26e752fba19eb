"""What an unlearning result claims, as one typed record read the same way for every method.

A result JSON (``fedunlearn unlearn --out``) carries, besides its model, claims a reader of the
run acts on: the method and its parameters, the method's own statements in its details (its
``variant``, whether it says its model is a DP release, its ``warnings`` and ``assumptions``),
the lineage it read, and its receipt's verdicts (the influence and the checks that warn or
fail). ``ResultClaims.from_doc`` reads them by name, without knowing the method; ``runs``
(``fedunlearn apply``) reads this record, never a method's details.

A claim is what the file says: ``fedunlearn apply`` refuses to act on a DP claim and derives
whether the model is DP from the method, its parameters and the run
(``fedunlearn.privacy.releases``); the seal (``fedunlearn.history.digest``) is checked before
any claim is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CLAIM_FIELDS", "FlaggedCheck", "ResultClaims", "removal_problem"]

#: The details fields a result's claims are read from (each optional: a method defines its own).
CLAIM_FIELDS = (
    "variant",
    "released_model_dp",
    "released_model_reason",
    "warnings",
    "assumptions",
)


@dataclass(frozen=True)
class FlaggedCheck:
    """A receipt check that did not pass: its name, verdict (``warn``/``fail``) and reason."""

    check: str
    verdict: str
    reason: Any = None

    def to_dict(self) -> dict[str, Any]:
        """Return the check as the apply output lists it."""
        return {"check": self.check, "verdict": self.verdict, "reason": self.reason}


def _sentences(value: Any) -> tuple[str, ...]:
    """A details field of sentences (one string, or a list of them) as a tuple."""
    if isinstance(value, str):
        return (value,)
    return tuple(str(w) for w in value or ())


def removal_problem(influence: Any, basis: Any, lineage_kind: Any) -> str | None:
    """Why ``influence``, on ``basis`` and a lineage of ``lineage_kind``, is no receipt's word.

    None when it is one. A receipt says ``removed`` only by construction: basis
    ``exact_lineage``, on a lineage of kind ``exact`` (unlearn/receipt.py, ``influence_basis``);
    and ``exact_lineage`` is the basis of ``removed`` only. Receipts written before they named
    a basis (2026-11-28) also said ``removed`` when checks with power passed: such a word is
    not one this version gives.
    """
    removed = influence == "removed"
    if not removed:
        if basis != "exact_lineage":
            return None
        return f"influence {influence} on basis exact_lineage, which only removed has"
    if basis == "exact_lineage" and lineage_kind == "exact":
        return None
    if basis is None and lineage_kind != "exact":
        return (
            "influence removed with no basis on a lineage that is not exact: written before "
            "receipts named their basis, when checks with power could say removed (today they "
            "say not_detected at most); judge the model again with 'fedunlearn audit --result', "
            "or unlearn again"
        )
    if basis is None:
        return None  # an exact lineage's removed, written before bases were named
    return (
        f"influence removed on basis {basis} with a lineage of kind {lineage_kind}; a receipt "
        "says removed only by an exact lineage"
    )


def _mapping(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class ResultClaims:
    """What a result says about itself, typed (``from_doc``).

    Attributes:
        method: The method's registered name ("" when the result names none).
        params: The method's parameters as the result records them.
        variant: The method's name for what ran (e.g. ``FedADP-without-DP``), or None.
        released_model_dp: Whether the method says its model is a DP release (None: silent).
        released_model_reason: The method's sentence for it, or None.
        warnings: The method's warnings (sentences about a result that may not be trusted).
        assumptions: What the result rests on that no check sees (e.g. a threat model).
        lineage: The lineage record (which stored rounds the method read), or None.
        receipt: Whether the result carries a receipt (``verification``).
        influence: The receipt's influence verdict, or None.
        influence_basis: What the receipt rests that verdict on (``exact_lineage``, ...), or None.
        receipt_lineage: The lineage the receipt states (``verification.lineage``), or None.
        client_verdicts: ``(client, request, influence, basis)`` of each per-client entry.
        clients_malformed: The receipt's ``clients`` is not a list of entries (mappings).
        flagged: The receipt's checks that warn or fail, the store's checks left out (they
            describe the store before an apply changes it).
    """

    method: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    variant: str | None = None
    released_model_dp: bool | None = None
    released_model_reason: str | None = None
    warnings: tuple[str, ...] = ()
    assumptions: tuple[str, ...] = ()
    lineage: dict[str, Any] | None = None
    receipt: bool = False
    influence: Any = None
    influence_basis: Any = None
    receipt_lineage: dict[str, Any] | None = None
    client_verdicts: tuple[tuple[Any, Any, Any, Any], ...] = ()
    clients_malformed: bool = False
    flagged: tuple[FlaggedCheck, ...] = ()

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> ResultClaims:
        """Read the claims of a result JSON; a missing or malformed part claims nothing.

        The per-client entries are the exception: entries that are not a list of mappings are
        recorded as such (``clients_malformed``), so that a verdict cannot hide in them.
        """
        doc = doc if isinstance(doc, Mapping) else {}
        details = _mapping(doc.get("details"))
        receipt = doc.get("verification")
        receipt = receipt if isinstance(receipt, Mapping) else None
        checks = receipt.get("checks") if receipt is not None else None
        flagged = tuple(
            FlaggedCheck(str(c.get("name")), str(c.get("verdict")), c.get("reason"))
            for c in (checks if isinstance(checks, list) else [])
            if isinstance(c, Mapping)
            and c.get("verdict") in ("warn", "fail")
            and c.get("scope") != "store"  # the store before the apply, which changes it
        )
        dp = details.get("released_model_dp")
        reason = details.get("released_model_reason")
        variant = details.get("variant")
        lineage = doc.get("lineage")
        stated = receipt.get("lineage") if receipt is not None else None  # audit --out's place
        entries = receipt.get("clients") if receipt is not None else None
        listed = entries if isinstance(entries, list) else []
        clients = tuple(
            (e.get("client"), e.get("request"), e.get("influence"), e.get("basis"))
            for e in listed
            if isinstance(e, Mapping)
        )
        malformed = entries is not None and (
            not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries)
        )
        return cls(
            method=str(doc.get("method", "")),
            params=_mapping(doc.get("params")),
            variant=None if variant is None else str(variant),
            released_model_dp=None if dp is None else bool(dp),
            released_model_reason=None if reason is None else str(reason),
            warnings=_sentences(details.get("warnings")),
            assumptions=_sentences(details.get("assumptions")),
            lineage=dict(lineage) if isinstance(lineage, Mapping) else None,
            receipt=receipt is not None,
            influence=receipt.get("influence") if receipt is not None else None,
            influence_basis=receipt.get("influence_basis") if receipt is not None else None,
            receipt_lineage=dict(stated) if isinstance(stated, Mapping) else None,
            client_verdicts=clients,
            clients_malformed=malformed,
            flagged=flagged,
        )

    def unsupported_removal(self) -> str | None:
        """Why a verdict of the receipt (its own, or a client's) is not one a receipt gives.

        ``removal_problem`` of the receipt's influence and of each per-client entry, on the
        lineage the document states (the result's and the receipt's must agree), and an
        earlier client's ``removed`` only on a lineage from M_0 (``eval.generations``: a
        request that read nothing after M_0). None when every one holds. The seal holds no
        key, so an edit under a recomputed seal reaches here: apply and check-receipt refuse it
        instead of repeating the word.
        """
        stated = [x for x in (self.lineage, self.receipt_lineage) if x is not None]
        kinds = {str(x.get("kind")) for x in stated}
        if len(kinds) > 1:
            return f"it states two lineages of different kinds ({', '.join(sorted(kinds))})"
        kind = stated[0].get("kind") if stated else None
        if self.clients_malformed:
            return "its receipt's 'clients' is not a list of client entries"
        problem = removal_problem(self.influence, self.influence_basis, kind)
        if problem is not None:
            return f"its receipt says {problem}"
        for client, request, influence, basis in self.client_verdicts:
            problem = removal_problem(influence, basis, kind)
            if problem is None and influence == "removed" and request == "earlier":
                if stated[0].get("start_round") != 0:
                    problem = (
                        "removed for a client forgotten earlier, on a lineage that does not "
                        "start from M_0"
                    )
            if problem is not None:
                return f"its entry for client {client} says {problem}"
        return None

    def receipt_note(self) -> dict[str, Any] | None:
        """What the receipt says, for the apply output: influence and non-passing checks."""
        if not self.receipt:
            return None
        return {"influence": self.influence, "flagged": [c.to_dict() for c in self.flagged]}
