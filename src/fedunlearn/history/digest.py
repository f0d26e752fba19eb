"""Integrity digests of JSON documents: a result, a receipt, a store's metadata.

A document fedunlearn writes and later reads back to act on (the result JSON ``apply`` makes the
run's model, the receipt ``audit --out`` writes, the metadata inside a history store) carries a
SHA-256 over its **canonical JSON**: the whole document, keys sorted, no whitespace, UTF-8
(``canonical_json``), with the digest field itself left out. ``seal`` adds it, ``check_seal``
recomputes it and refuses a document whose content changed, or one sealed for another run.

``seal(doc, bound_to)`` writes ``doc["integrity"] = {"algorithm", "bound_to", "sha256"}``.
``bound_to`` names what the document is about (for a result: the run's config fingerprint,
generation, last round and last model's SHA-256, ``UnlearnSession.identity``); it is part of the
digested content, so a document cannot be moved to another run by editing it, and
``check_seal(doc, expected=...)`` compares it with the run as the reader finds it.

What it protects against, and what not: the digest is a checksum anyone can recompute (there is
no key), so it catches a document edited by hand or by a script that does not recompute it
(``verification.influence`` changed from ``not_shown`` to ``removed``, a ``test_accuracy``
changed), a truncated or damaged file, and a document of another run; it does not stop someone
who edits the document and recomputes the digest with this module. A result and a receipt also
carry the head of the run's committed history (``bound_to["chain"]``: ``history.store.chain``),
which ``fedunlearn check-receipt`` finds in the run's chain, and whose figures and exact model
it re-derives (``experiments.receipt_check``); a head can be signed (``runs.chain_signing``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from fedunlearn.errors import IntegrityError

__all__ = [
    "ALGORITHM",
    "INTEGRITY_KEY",
    "canonical_json",
    "canonical_sha256",
    "check_seal",
    "document_sha256",
    "seal",
]

#: Key of the digest in a sealed document.
INTEGRITY_KEY = "integrity"
#: The digest's name: SHA-256 over ``canonical_json`` of the document without ``INTEGRITY_KEY``'s
#: ``sha256`` (version 1 of the canonical form).
ALGORITHM = "sha256/canonical-json-v1"


def canonical_json(doc: Any) -> bytes:
    """Return the canonical JSON of ``doc``: keys sorted, no whitespace, UTF-8.

    Tuples serialise as lists and a JSON round trip gives the same bytes, so a document read
    back from its file has the digest it was sealed with.

    Raises:
        IntegrityError: ``doc`` holds a value JSON cannot represent.
    """
    try:
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as err:
        raise IntegrityError(f"the document cannot be digested: not JSON ({err})") from None
    return text.encode("utf-8")


def canonical_sha256(doc: Any) -> str:
    """Return the SHA-256 (hex) of ``canonical_json(doc)``."""
    return hashlib.sha256(canonical_json(doc)).hexdigest()


def _unsealed(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The content a digest covers: ``doc`` with its integrity entry but no ``sha256``."""
    body = dict(doc)
    entry = body.get(INTEGRITY_KEY)
    if isinstance(entry, Mapping):
        body[INTEGRITY_KEY] = {k: v for k, v in entry.items() if k != "sha256"}
    return body


def document_sha256(doc: Mapping[str, Any]) -> str:
    """Return the digest ``seal`` would write for ``doc`` (its current content)."""
    return canonical_sha256(_unsealed(doc))


def seal(doc: dict[str, Any], bound_to: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Add ``doc["integrity"]`` (in place) and return it.

    Args:
        doc: The document (JSON values only); sealed as it is now, so write it unchanged.
        bound_to: What the document is about (e.g. the run's identity); digested with it and
            compared by ``check_seal(..., expected=...)``.

    Returns:
        ``{"algorithm", "bound_to", "sha256"}``.
    """
    doc.pop(INTEGRITY_KEY, None)
    # a JSON round trip first: what a reader parses is what was digested
    entry: dict[str, Any] = {
        "algorithm": ALGORITHM,
        "bound_to": json.loads(canonical_json(dict(bound_to or {}))),
    }
    doc[INTEGRITY_KEY] = entry
    entry["sha256"] = document_sha256(json.loads(canonical_json(doc)))
    return entry


def check_seal(
    doc: Mapping[str, Any],
    what: str,
    *,
    expected: Mapping[str, Any] | None = None,
) -> None:
    """Refuse ``doc`` unless its digest matches its content (and ``expected``, if given).

    Args:
        doc: A document ``seal`` sealed (as read back from its file).
        what: How the message names it (e.g. ``--result R.json``).
        expected: Values ``bound_to`` must hold (each key given), e.g. the run's config
            fingerprint; a document of another run is refused.

    Raises:
        IntegrityError: No digest, a digest that does not match the content (the document was
            edited, or damaged, after it was written), or a binding that differs.
    """
    entry = doc.get(INTEGRITY_KEY)
    if not isinstance(entry, Mapping) or not isinstance(entry.get("sha256"), str):
        raise IntegrityError(
            f"{what} carries no integrity digest ('{INTEGRITY_KEY}'): it was written by an older "
            "fedunlearn or the digest was removed; write it again (e.g. 'fedunlearn unlearn "
            "... --out'); nothing was changed"
        )
    if entry.get("algorithm") != ALGORITHM:
        raise IntegrityError(
            f"{what}: unknown integrity algorithm {entry.get('algorithm')!r} (this fedunlearn "
            f"checks {ALGORITHM}); nothing was changed"
        )
    if document_sha256(doc) != entry["sha256"]:
        raise IntegrityError(
            f"{what} was changed after fedunlearn wrote it (its content no longer matches its "
            "integrity digest), so nothing it says can be trusted; use the file as written, or "
            "compute the result again; nothing was changed"
        )
    bound = entry.get("bound_to") or {}
    for key, value in (expected or {}).items():
        if bound.get(key) != value:
            raise IntegrityError(
                f"{what} belongs to another run or another state of this one (its {key} is "
                f"{str(bound.get(key))[:16]!r}, this run's {str(value)[:16]!r}); nothing was "
                "changed"
            )
