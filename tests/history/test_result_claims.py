"""A result's claims as one typed record, read by name for every method (issue 38, item 3)."""

from __future__ import annotations

import pytest

from fedunlearn.history.result_claims import FlaggedCheck, ResultClaims, removal_problem

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


@pytest.mark.parametrize(
    ("influence", "basis", "kind", "problem"),
    [
        ("removed", "exact_lineage", "exact", None),
        ("removed", None, "exact", None),  # an exact lineage's, before bases were named
        ("not_detected", "powered_pass", "approximate", None),
        ("not_shown", "no_limit", None, None),
        (None, None, None, None),  # no receipt
        ("removed", None, "approximate", "written before receipts named their basis"),
        ("removed", "powered_pass", "approximate", "says removed only by an exact lineage"),
        ("removed", "exact_lineage", "approximate", "says removed only by an exact lineage"),
        ("removed", "exact_lineage", None, "says removed only by an exact lineage"),
        ("not_shown", "exact_lineage", "exact", "which only removed has"),
    ],
)
def test_removed_is_a_receipts_word_only_by_an_exact_lineage(influence, basis, kind, problem):
    got = removal_problem(influence, basis, kind)
    if problem is None:
        assert got is None
    else:
        assert problem in got


def test_a_clients_entry_is_held_to_the_same_rule():
    """A review: a per-client entry edited to removed passed check-receipt."""
    doc = {
        "lineage": {"kind": "approximate"},
        "verification": {
            "influence": "not_shown",
            "influence_basis": "no_limit",
            "clients": [
                {"client": 2, "influence": "not_shown", "basis": "no_limit"},
                {"client": 4, "influence": "removed", "basis": "exact_lineage"},
            ],
        },
    }
    problem = ResultClaims.from_doc(doc).unsupported_removal()
    assert problem is not None
    assert problem.startswith("its entry for client 4 says influence removed")
    doc["verification"]["clients"].pop()
    assert ResultClaims.from_doc(doc).unsupported_removal() is None


def test_a_receipts_lineage_is_read_where_audit_writes_it():
    receipt = {"verification": {"influence": "removed", "influence_basis": "exact_lineage"}}
    assert ResultClaims.from_doc(receipt).unsupported_removal() is not None
    receipt["verification"]["lineage"] = {"kind": "exact"}
    assert ResultClaims.from_doc(receipt).unsupported_removal() is None


def _receipt_doc(**verification):
    return {
        "verification": {"influence": "not_shown", "influence_basis": "no_limit", **verification}
    }


def test_a_receipts_verdict_rests_on_its_own_lineage_not_a_second_one_added():
    """A second review: a top-level exact lineage added to a receipt cleared its 'removed'."""
    doc = _receipt_doc(influence="removed", influence_basis=None, lineage={"kind": "approximate"})
    doc["lineage"] = {"kind": "exact"}
    problem = ResultClaims.from_doc(doc).unsupported_removal()
    assert problem is not None
    assert "two lineages of different kinds (approximate, exact)" in problem


@pytest.mark.parametrize("clients", [5, {"3": {"client": 3}}, [{"client": 3}, 5], "x"])
def test_client_entries_that_are_not_a_list_of_entries_are_refused_not_skipped(clients):
    """A second review: an int crashed apply and check-receipt; a dict hid a 'removed'."""
    problem = ResultClaims.from_doc(_receipt_doc(clients=clients)).unsupported_removal()
    assert problem == "its receipt's 'clients' is not a list of client entries"


def test_a_document_that_is_not_a_mapping_claims_nothing():
    claims = ResultClaims.from_doc([1])  # type: ignore[arg-type]
    assert claims.receipt is False
    assert claims.unsupported_removal() is None


@pytest.mark.parametrize(("start", "ok"), [(0, True), (4, False)])
def test_an_earlier_clients_removed_needs_a_lineage_from_m0(start, ok):
    """A second review: eval.generations says removed for an earlier client only from M_0."""
    doc = {
        "lineage": {"kind": "exact", "start_round": start},
        "verification": {
            "influence": "removed",
            "influence_basis": "exact_lineage",
            "clients": [
                {
                    "client": 3,
                    "request": "earlier",
                    "influence": "removed",
                    "basis": "exact_lineage",
                }
            ],
        },
    }
    problem = ResultClaims.from_doc(doc).unsupported_removal()
    if ok:
        assert problem is None
    else:
        assert problem is not None
        assert "client 3" in problem
        assert "does not start from M_0" in problem
