"""A result's claims as one typed record, read by name for every method (issue 38, item 3)."""

from __future__ import annotations

from fedunlearn.history.result_claims import FlaggedCheck, ResultClaims

RECEIPT = {
    "influence": "removed",
    "checks": [
        {"name": "retrain_distance", "verdict": "pass", "scope": "model"},
        {"name": "membership", "verdict": "warn", "scope": "model", "reason": "AUC 0.61"},
        {"name": "deletion_evidence", "verdict": "fail", "scope": "store", "reason": "x"},
        {"name": "markers", "verdict": "fail", "reason": None},
        "not a check",
    ],
}


def test_the_claims_of_any_method_are_read_by_name():
    doc = {
        "method": "fedadp",
        "params": {"unlearn_dp": True},
        "details": {
            "variant": "FedADP",
            "released_model_dp": True,
            "released_model_reason": "every fresh update noised",
            "warnings": "one sentence",
            "assumptions": ["semi-honest servers", "a dealer"],
        },
        "lineage": {"kind": "replay", "rounds": [1, 2]},
        "verification": RECEIPT,
    }

    claims = ResultClaims.from_doc(doc)

    assert claims.method == "fedadp"
    assert claims.params == {"unlearn_dp": True}
    assert claims.variant == "FedADP"
    assert claims.released_model_dp is True
    assert claims.warnings == ("one sentence",)
    assert claims.assumptions == ("semi-honest servers", "a dealer")
    assert claims.lineage == {"kind": "replay", "rounds": [1, 2]}
    assert claims.influence == "removed"
    # the store's checks describe the store before the apply: left out; passes are not flagged
    assert claims.flagged == (
        FlaggedCheck("membership", "warn", "AUC 0.61"),
        FlaggedCheck("markers", "fail", None),
    )


def test_the_receipt_note_is_the_apply_outputs():
    note = ResultClaims.from_doc({"method": "retrain", "verification": RECEIPT}).receipt_note()

    assert note == {
        "influence": "removed",
        "flagged": [
            {"check": "membership", "verdict": "warn", "reason": "AUC 0.61"},
            {"check": "markers", "verdict": "fail", "reason": None},
        ],
    }


def test_a_malformed_or_silent_result_claims_nothing():
    claims = ResultClaims.from_doc(
        {"params": ["not", "a", "mapping"], "details": "text", "verification": "yes", "lineage": 3}
    )

    assert claims == ResultClaims()
    assert claims.released_model_dp is None
    assert claims.receipt_note() is None
