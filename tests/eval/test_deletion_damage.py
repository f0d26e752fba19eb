"""The deletion rule's signs of damage: each one's code and facts, and the order they are read in.

``_damage`` returns the first sign that a deletion did not hold (docs: the rule's module
docstring, "Grade, in order"); a receipt names that one code.
"""

from __future__ import annotations

import pytest

from fedunlearn.eval.receipt.rules.deletion import _damage

PAIRS = [[1, 3], [2, 3], [3, 3], [4, 3]]

# (evidence that shows one sign, its code and facts), in the order the rule reads them
SIGNS = [
    ({"read_back": {"readable": PAIRS}}, "readable", {"count": 4, "pairs": PAIRS[:3]}),
    ({"reconstructible": PAIRS[:1]}, "rebuildable", {"count": 1, "pairs": PAIRS[:1]}),
    ({"unrecorded": PAIRS}, "unrecorded", {"count": 4, "pairs": PAIRS[:3]}),
    ({"participation": {"missing": PAIRS[:2]}}, "rows_missing", {"count": 2, "pairs": PAIRS[:2]}),
    (
        {"missing_models": ["a", "b", "c", "d"]},
        "models_unrecorded",
        {"count": 4, "models": ["a", "b", "c"]},
    ),
    ({"page_scan": {"fragments_found": 7}}, "fragments", {"count": 7}),
    ({"scan": {"ok": False, "reason": "torn page"}}, "scan_failed", {"why": "torn page"}),
    ({"scalars_kept": PAIRS}, "scalars_kept", {"count": 4, "pairs": PAIRS[:3]}),
    ({"result_files": ["r.json"]}, "result_files", {"count": 1, "files": ["r.json"]}),
]


@pytest.mark.parametrize(("deletion", "code", "facts"), SIGNS, ids=[s[1] for s in SIGNS])
def test_each_sign_alone(deletion, code, facts):
    assert _damage(deletion) == (code, facts)


def test_the_first_sign_in_order_is_named():
    for first in range(len(SIGNS)):
        merged: dict = {}
        for deletion, _, _ in SIGNS[first:]:
            merged |= deletion
        assert _damage(merged)[0] == SIGNS[first][1]


@pytest.mark.parametrize(
    "clean",
    [
        {},
        {"read_back": None, "participation": None, "scan": None, "page_scan": None},
        {
            "read_back": {"readable": []},
            "reconstructible": [],
            "unrecorded": None,
            "participation": {"missing": []},
            "missing_models": [],
            "page_scan": {"fragments_found": 0},
            "scan": {"ok": True},
            "scalars_kept": [],
            "result_files": [],
        },
    ],
)
def test_no_sign(clean):
    assert _damage(clean) is None


def test_a_failed_scan_without_a_reason():
    assert _damage({"scan": {"ok": False}}) == ("scan_failed", {"why": "the page scan found it"})
