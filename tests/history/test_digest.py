"""Integrity digests of JSON documents (history/digest.py): what a seal catches and what not."""

import json

import pytest

from fedunlearn.errors import IntegrityError
from fedunlearn.history.digest import (
    ALGORITHM,
    canonical_json,
    canonical_sha256,
    check_seal,
    document_sha256,
    seal,
)

RUN = {"fingerprint": "f" * 8, "generation": 0, "last_round": 4, "model_sha256": "m" * 8}


def sealed():
    doc = {
        "method": "retrain",
        "test_accuracy": 0.91,
        "verification": {"influence": "not_shown", "checks": [{"name": "backdoor"}]},
        "run": dict(RUN),
    }
    seal(doc, doc["run"])
    return doc


def test_the_canonical_form_ignores_key_order_and_whitespace_and_survives_a_file():
    a = {"b": [1, 2.5, None], "a": {"y": "é", "x": True}}
    b = json.loads(json.dumps(a, indent=4))
    assert canonical_json(a) == b'{"a":{"x":true,"y":"\xc3\xa9"},"b":[1,2.5,null]}'
    assert canonical_sha256(a) == canonical_sha256(b) == canonical_sha256(dict(reversed(a.items())))


def test_a_sealed_document_read_back_from_its_file_passes():
    doc = sealed()
    back = json.loads(json.dumps(doc, indent=2))
    check_seal(back, "r.json", expected={"fingerprint": RUN["fingerprint"]})
    assert back["integrity"]["algorithm"] == ALGORITHM
    assert back["integrity"]["sha256"] == document_sha256(back)


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["verification"].__setitem__("influence", "removed"),
        lambda d: d.__setitem__("test_accuracy", 0.99),
        lambda d: d["verification"]["checks"].append({"name": "extra"}),
        lambda d: d.pop("method"),
        lambda d: d["integrity"]["bound_to"].__setitem__("generation", 3),
    ],
)
def test_any_edit_of_the_content_or_the_binding_is_refused(edit):
    doc = sealed()
    edit(doc)
    with pytest.raises(IntegrityError, match="was changed after fedunlearn wrote it"):
        check_seal(doc, "r.json")


def test_an_unsealed_document_and_one_of_another_run_are_refused():
    doc = sealed()
    with pytest.raises(IntegrityError, match="belongs to another run"):
        check_seal(doc, "r.json", expected={"fingerprint": "g" * 8})
    doc.pop("integrity")
    with pytest.raises(IntegrityError, match="carries no integrity digest"):
        check_seal(doc, "r.json")


def test_a_forger_with_the_code_can_reseal_an_edit():
    """What the digest does not protect against (docs/faults.md): it has no key."""
    doc = sealed()
    doc["verification"]["influence"] = "removed"
    seal(doc, doc["run"])
    check_seal(doc, "r.json")  # passes: the digest catches edits, not a forger
