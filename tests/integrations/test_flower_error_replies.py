"""A node's error reply whose reason is missing or blank (Flower types it ``str | None``).

Before: ``reply.error.reason.strip()`` raised AttributeError on None (and
``.splitlines()[-1]`` IndexError on a blank reason) in the middle of sorting a round's replies,
so one silent node failed the whole round. Now the client is recorded missing with
"no reason given" and the other replies are sorted as before.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip(
    "flwr", reason='Flower is not installed; pip install -e ".[flower]" to run these tests'
)

from fedunlearn.integrations.flower.app_rounds import AppRound, sort_replies  # noqa: E402
from fedunlearn.integrations.flower.messages import error_text  # noqa: E402


def error_reply(node: int, reason: str | None) -> SimpleNamespace:
    """What sort_replies reads of a Flower error reply: its node, has_error(), the reason."""
    return SimpleNamespace(
        metadata=SimpleNamespace(src_node_id=node),
        has_error=lambda: True,
        error=SimpleNamespace(code=1, reason=reason),
    )


@pytest.mark.parametrize("reason", [None, "", "  \n "])
def test_a_missing_or_blank_reason_reads_no_reason_given(reason):
    assert error_text(error_reply(3, reason)) == "no reason given"
    assert error_text(error_reply(3, reason), last_line=True) == "no reason given"


def test_the_end_of_a_traceback_is_kept():
    reply = error_reply(3, "Traceback ...\n  File x\nValueError: bad shard\n")
    assert error_text(reply, last_line=True) == "ValueError: bad shard"
    assert error_text(reply, 9) == "bad shard"


def test_a_round_with_a_silent_node_records_its_clients_missing():
    rnd = AppRound(1, torch.zeros(2), torch.zeros(2))
    good = sort_replies(
        rnd,
        [error_reply(7, None), error_reply(8, "ValueError: out of memory")],
        layout=None,  # never read for error replies
        asked={0, 1, 2},
        node_clients={7: {0, 1}, 8: {2}},
        sizes={},
        weight_key="num-examples",
        max_abs=1e6,
    )
    assert good == []
    assert rnd.missing == {
        0: "client error: ...no reason given",
        1: "client error: ...no reason given",
        2: "client error: ...ValueError: out of memory",
    }
