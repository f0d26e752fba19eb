"""What a lying peer can send, for the message fuzz tests (issue 41), and how errors must look.

``json_values(words)`` draws any JSON value a peer could send: scalars of every kind (integers
past 40 digits, unicode digits such as "²" and "١٢" that ``str.isdigit`` accepts, a 5,000-digit
string, ``words`` of the protocol under test), nested lists and objects. ``FUZZ`` is the
hypothesis profile of those tests; ``one_line`` asserts that an error is the library's, on one
bounded line (what the CLI prints before exit 2).
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from fedunlearn.errors import FedUnlearnError

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
TRICKY = ("²", "١٢", "12", "9" * 5_000, "\n", "a" * 64)


def json_values(words: Sequence[str] = ()) -> st.SearchStrategy:
    """Any JSON value, with the tricky strings and the protocol's ``words`` among the scalars."""
    scalars = (
        st.none()
        | st.booleans()
        | st.integers()
        | st.integers(min_value=-(10**60), max_value=10**60)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=20)
        | st.sampled_from([*TRICKY, *words])
    )
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=12,
    )


def one_line(exc: BaseException) -> None:
    """The error is the library's, on one bounded line."""
    assert isinstance(exc, FedUnlearnError), repr(exc)
    text = str(exc)
    assert "\n" not in text, text[:300]
    assert len(text) < 5_000, text[:300]
