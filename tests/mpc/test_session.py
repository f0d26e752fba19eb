"""Session binding: hellos compared field by field (issue 15: mismatched runs refused)."""

from __future__ import annotations

import numpy as np
import pytest

from fedunlearn.errors import MalformedFrameError, SessionMismatchError
from fedunlearn.mpc.session import (
    PROTOCOL_VERSION,
    Hello,
    SessionBinding,
    decode_message,
    digest,
    encode_message,
)

JOB = {
    "run_config": digest("lr: 0.1\nrounds: 40\n"),
    "forget_set": digest([3]),
    "trajectory": digest(b"models"),
    "share_store": digest(b"store"),
}


def test_a_matching_binding_passes_and_a_differing_one_names_every_field():
    ours = SessionBinding("run-42", JOB)
    ours.check(SessionBinding("run-42", dict(JOB)), "server1")
    theirs = SessionBinding("run-43", {**JOB, "forget_set": digest([4])})
    del theirs.digests["share_store"]
    with pytest.raises(SessionMismatchError) as info:
        ours.check(theirs, "server1 at 10.0.0.2:4711")
    message = str(info.value)
    assert "server1 at 10.0.0.2:4711" in message
    assert "session_id: ours 'run-42', theirs 'run-43'" in message
    assert "digest forget_set" in message and "digest share_store" in message
    assert "theirs missing" in message
    assert "digest run_config" not in message and "digest trajectory" not in message
    assert set(info.value.differences) == {"session_id", "digest forget_set", "digest share_store"}


def test_the_dealer_sees_one_job_digest_that_changes_with_any_part():
    dealer_view = SessionBinding("run-42", JOB).for_dealer()
    assert list(dealer_view.digests) == ["job"]
    assert JOB["forget_set"] not in dealer_view.digests.values()
    other = SessionBinding("run-42", {**JOB, "forget_set": digest([4])}).for_dealer()
    assert other.digests["job"] != dealer_view.digests["job"]
    assert dealer_view.for_dealer() == dealer_view


@pytest.mark.parametrize(
    ("session", "digests", "message"),
    [
        ("", {}, "session id"),
        ("a b", {}, "session id"),
        ("ok", {"1bad": digest("x")}, "digest names"),
        ("ok", {"good": "not-hex"}, "hex"),
    ],
)
def test_malformed_bindings_are_rejected(session, digests, message):
    with pytest.raises(ValueError, match=message):
        SessionBinding(session, digests)


def test_hellos_round_trip_and_options_are_compared():
    ours = Hello("server0", SessionBinding("s", JOB), {"mask_scale_bits": 2, "frac_bits": 16})
    doc = decode_message(encode_message(ours.to_json()), "peer")
    parsed = Hello.parse(doc, "peer")
    assert parsed == ours
    theirs = Hello("server1", SessionBinding("s", JOB), {"mask_scale_bits": 3, "frac_bits": 16})
    assert ours.differences(theirs) == {"option mask_scale_bits": (2, 3)}


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (np.frombuffer(b"\xff\xfe", dtype=np.uint8), "not JSON"),
        (encode_message({"a": 1})[:0], "not JSON"),
        (np.zeros(3, dtype=np.uint64), "handshake message"),
        (encode_message({"protocol": "other", "version": PROTOCOL_VERSION}), "speaks protocol"),
        (encode_message({"protocol": "fedunlearn-mpc", "version": 1}), "version 1"),
    ],
    ids=["bytes", "empty", "dtype", "protocol", "version"],
)
def test_malformed_hellos_are_rejected(frame, message):
    with pytest.raises(MalformedFrameError, match=message):
        Hello.parse(decode_message(frame, "peer"), "peer")


def test_hellos_are_small():
    with pytest.raises(ValueError, match="at most"):
        encode_message({"x": "y" * 20000})
