"""Per-client receipt entries on a living run (eval/generations.py)."""

from types import SimpleNamespace

import torch

from fedunlearn.eval.generations import client_entries
from fedunlearn.history.store import AppliedEvent
from fedunlearn.unlearn.receipt import Check, Verification

EVENT = AppliedEvent(1, 0.0, "trajectory", (0,), (0,), "fedrecover", "forget", "r" * 64,
                     "c" * 64, "m" * 64, 30, 30, 0, 0, 0)  # fmt: skip


def run_view():
    store = SimpleNamespace(events=lambda: [EVENT])
    return SimpleNamespace(
        store=store,
        malicious=frozenset({1}),
        applied=frozenset({0}),
        initial_params=torch.zeros(10),
    )


def receipt(backdoor="pass", membership="inconclusive", lineage=None):
    return Verification(
        checks=(
            Check("backdoor", "backdoor removed", backdoor),
            Check("membership", "membership", membership),
            Check("deletion", "stored data deleted", "pass", aspect="store", scope="store"),
        ),
        lineage=lineage,
    )


DELETION = {
    "bytes_held": {0: 0, 1: 400},
    "records": [{"client_id": 0, "num_payloads": 30, "size_bytes": 1200}],
    "reconstructible": [],
}


def test_an_earlier_client_is_never_shown_removed_without_a_control():
    entries = client_entries(run_view(), receipt(), DELETION, frozenset({0, 1}))

    earlier, attacker = entries
    assert earlier["request"] == "earlier"
    assert earlier["influence"] == "not_shown"
    assert earlier["basis"] == "no_control"
    assert earlier["removed_by"]["receipt_sha256"] == "c" * 64
    assert earlier["store"] == {
        "status": "deleted", "bytes_held": 0, "deleted_payloads": 30, "reconstructible": []
    }  # fmt: skip
    # the backdoor check speaks for the attacker only, and flags nothing
    assert attacker["request"] == "new"
    assert attacker["role"] == "attacker"
    assert attacker["influence"] == "not_detected"
    assert attacker["store"]["status"] == "held"
    assert attacker["basis"] == "powered_pass"
    assert {"check": "backdoor", "verdict": "pass"} in attacker["checks"]
    assert {"check": "backdoor", "verdict": "pass"} not in earlier["checks"]


def test_a_flag_on_the_whole_set_is_not_attributed_to_an_earlier_client():
    entries = client_entries(run_view(), receipt(membership="fail"), DELETION, frozenset({0, 1}))
    assert entries[0]["influence"] == "not_shown"
    assert entries[1]["influence"] == "remains"
    assert entries[0]["basis"] == "not_attributable"


def test_only_fresh_training_from_m0_with_an_exact_lineage_removes_an_earlier_client():
    exact = receipt(lineage={"kind": "exact", "start_round": 0, "reason": "started from M_0"})
    fresh = client_entries(run_view(), exact, DELETION, frozenset({0, 1}), history_bytes_read=40)
    read_more = client_entries(
        run_view(), exact, DELETION, frozenset({0, 1}), history_bytes_read=41
    )
    assert fresh[0]["influence"] == "removed"
    assert read_more[0]["influence"] == "not_shown"  # it read an applied trajectory's rounds
