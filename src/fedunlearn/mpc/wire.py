"""Bounded parsing of the JSON messages peers send (hellos, ready, the clients' messages).

A peer with a valid certificate can still send anything. ``json.loads`` on its bytes fails in
ways that are not a ``JSONDecodeError``: 16 KiB of ``[`` recurses until ``RecursionError``, and
an integer of more than 4,300 digits raises ``ValueError`` (CPython's limit on int-string
conversion), each a traceback that killed ``starfish-clients`` (issue 25). ``parse_object``
checks before and while parsing, and every failure is one ``MalformedFrameError`` line that
drops the peer:

- size: at most ``max_bytes`` (the caller's cap, also enforced by the frame header);
- nesting: at most ``MAX_DEPTH`` levels of arrays and objects, and at most
  ``MAX_CONTAINERS`` of them in all, counted over the bytes outside strings before ``json``
  sees them (so the C scanner never recurses deeply, and a message cannot make it build
  hundreds of thousands of lists, whose garbage collection in a process holding a model costs
  about 0.5 s per MiB);
- numbers: integers of at most ``MAX_INT_DIGITS`` digits (a uint64 has 20), other numbers of
  at most ``MAX_NUMBER_CHARS`` characters and finite (no ``1e999``), no ``NaN`` or
  ``Infinity``;
- the top level is an object; the text is UTF-8.

**Time linear in the size** (issue 41). ``nesting_depth`` finds the strings and the brackets
outside them in a few vectorised passes (numpy), and ``json`` itself is linear. The former
count first blanked the strings with a regular expression that, on a quote followed by many
escaped quotes, restarted at every quote and scanned to the end each time: 16 KiB took about
1 s, 200 KB about 2 minutes, with the GIL held. Adversarial messages of 1 MiB (the largest
cap) now parse or are refused in about 0.1 s (``tests/mpc/test_wire.py``), so no deadline is
needed around the parser: its time is bounded by the cap.

The error names the peer and the rule, never the message's content.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from fedunlearn.errors import MalformedFrameError

__all__ = [
    "MAX_CONTAINERS",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "MAX_NUMBER_CHARS",
    "MAX_QUOTED_CHARS",
    "nesting_depth",
    "parse_object",
    "peer_text",
]

MAX_DEPTH = 32  # a hello nests 3 levels, the clients' messages 2
MAX_CONTAINERS = 1024  # arrays and objects in one message; a hello has 3, the clients' 4
MAX_INT_DIGITS = 40  # sign excluded; uint64 ring elements and client ids need at most 20
MAX_NUMBER_CHARS = 64  # a float as json.dumps writes it has at most 24
MAX_QUOTED_CHARS = 500  # what an error quotes of a peer's own words (a refusal's reason)
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_DEPTH_STEP = np.zeros(256, dtype=np.int64)
_DEPTH_STEP[[ord("["), ord("{")]] = 1
_DEPTH_STEP[[ord("]"), ord("}")]] = -1


class _Rejected(ValueError):
    """A number the hooks refuse (raised inside ``json.loads``)."""


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Rejected(f"an integer of more than {MAX_INT_DIGITS} digits")
    return int(text)


def _parse_float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise _Rejected(f"a number of more than {MAX_NUMBER_CHARS} characters")
    value = float(text)
    if not math.isfinite(value):
        raise _Rejected("a number beyond the float range")
    return value


def _parse_constant(name: str) -> float:
    raise _Rejected(f"the constant {name}")


def nesting_depth(data: bytes) -> int:
    """Return the deepest nesting of arrays and objects outside JSON strings (linear time)."""
    return _containers(data)[0]


def _containers(data: bytes) -> tuple[int, int]:
    """Return the deepest nesting and the number of arrays and objects outside strings.

    A quote opens or closes a string unless an odd run of backslashes precedes it; brackets
    between an opening and its closing quote do not count. Vectorised, so 1 MiB takes
    milliseconds whatever its content. Outside strings a backslash is invalid JSON, so on any
    prefix ``json`` accepts this reads the strings as ``json`` does: the depth it returns is
    at least the depth the parser reaches before it stops.
    """
    raw = np.frombuffer(data, dtype=np.uint8)
    if not raw.size:
        return 0, 0
    positions = np.arange(raw.size)
    # the last position at or before i that is not a backslash (-1: none)
    last_other = np.maximum.accumulate(np.where(raw == _BACKSLASH, -1, positions))
    quotes = np.flatnonzero(raw == _QUOTE)
    before = quotes - 1
    run = np.where(before >= 0, before - last_other[np.maximum(before, 0)], 0)
    toggles = np.zeros(raw.size, dtype=np.int64)
    toggles[quotes[run % 2 == 0]] = 1
    inside = np.cumsum(toggles) % 2 == 1  # from an opening quote to its closing one
    steps = _DEPTH_STEP[raw]
    steps[inside] = 0
    return max(0, int(np.cumsum(steps).max())), int(np.count_nonzero(steps == 1))


def parse_object(
    data: bytes, peer: str, *, max_bytes: int, what: str = "message"
) -> dict[str, Any]:
    """Parse a peer's JSON object within the bounds of the module docstring.

    Args:
        data: The frame's bytes.
        peer: How the error names the sender.
        max_bytes: The largest message allowed here.
        what: How the error names the message (``handshake message``).

    Returns:
        The object.

    Raises:
        MalformedFrameError: Too large, too deep, too many arrays and objects, a too long or
            non-finite number,
            NaN/Infinity, not UTF-8, not JSON, or not an object (one line; the content is not
            quoted).
    """
    if len(data) > max_bytes:
        raise MalformedFrameError(
            f"{peer} sent a {what} of {len(data)} bytes; at most {max_bytes} are allowed"
        )
    depth, containers = _containers(data)
    if depth > MAX_DEPTH:
        raise MalformedFrameError(
            f"{peer} sent a {what} nested {depth} levels deep; at most {MAX_DEPTH} are allowed"
        )
    if containers > MAX_CONTAINERS:
        raise MalformedFrameError(
            f"{peer} sent a {what} of {containers} arrays and objects; at most "
            f"{MAX_CONTAINERS} are allowed"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedFrameError(f"{peer} sent a {what} that is not JSON (not UTF-8)") from None
    try:
        doc = json.loads(
            text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant
        )
    except _Rejected as exc:
        raise MalformedFrameError(f"{peer} sent a {what} with {exc}; refused") from None
    except (json.JSONDecodeError, RecursionError, ValueError) as exc:
        reason = type(exc).__name__ if isinstance(exc, RecursionError) else str(exc)[:200]
        raise MalformedFrameError(f"{peer} sent a {what} that is not JSON: {reason}") from None
    if not isinstance(doc, dict):
        raise MalformedFrameError(f"{peer} sent a {what} that is not a JSON object")
    return doc


def peer_text(value: object, limit: int = MAX_QUOTED_CHARS) -> str:
    """A peer's words (a refusal's reason, a field it sent) as one bounded line for an error.

    Any JSON value is accepted (``str`` of it); whitespace runs, newlines included, become one
    space, and the text is cut at ``limit`` characters (marked ``...``).
    """
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: max(0, limit - 3)] + "..."
