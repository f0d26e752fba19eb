"""LinkLimits: the ready and join windows fall back to the connect timeout."""

from fedunlearn.mpc.security import LinkLimits


def test_ready_and_join_default_to_the_timeout():
    limits = LinkLimits(timeout_seconds=7.0)
    assert limits.ready_seconds == 7.0
    assert limits.join_seconds == 7.0


def test_ready_and_join_given_are_kept_apart():
    limits = LinkLimits(timeout_seconds=7.0, ready_timeout_seconds=2.5, join_timeout_seconds=0.5)
    assert limits.ready_seconds == 2.5
    assert limits.join_seconds == 0.5
