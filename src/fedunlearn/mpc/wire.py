"""Bounded parsing of the JSON messages peers send (hellos, ready, the clients' requests).

A peer with a valid certificate can still send anything. ``json.loads`` on its bytes fails in
ways that are not a ``JSONDecodeError``: 16 KiB of ``[`` recurses until ``RecursionError``, and
an integer of more than 4,300 digits raises ``ValueError`` (CPython's limit on int-string
conversion), each a traceback that killed ``starfish-clients`` (issue 25). ``parse_object``
checks before and while parsing, and every failure is one ``MalformedFrameError`` line that
drops the peer:

- size: at most ``max_bytes`` (the caller's cap, also enforced by the frame header);
- nesting: at most ``MAX_DEPTH`` levels of arrays and objects, counted over the bytes outside
  strings before ``json`` sees them (so the C scanner never recurses deeply);
- numbers: integers of at most ``MAX_INT_DIGITS`` digits (a uint64 has 20), no ``NaN`` or
  ``Infinity``;
- the top level is an object; the text is UTF-8.

The error names the peer and the rule, never the message's content.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fedunlearn.errors import MalformedFrameError

__all__ = ["MAX_DEPTH", "MAX_INT_DIGITS", "nesting_depth", "parse_object"]

MAX_DEPTH = 32  # a hello nests 3 levels, the clients' requests 2
MAX_INT_DIGITS = 40  # sign excluded; uint64 ring elements and client ids need at most 20
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(rb"[\[\]{}]")


class _Rejected(ValueError):
    """A number the hooks refuse (raised inside ``json.loads``)."""


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Rejected(f"an integer of more than {MAX_INT_DIGITS} digits")
    return int(text)


def _parse_constant(name: str) -> float:
    raise _Rejected(f"the constant {name}")


def nesting_depth(data: bytes) -> int:
    """Return the deepest nesting of arrays and objects outside JSON strings."""
    depth = deepest = 0
    for bracket in _BRACKETS.findall(_STRINGS.sub(b'""', data)):
        if bracket in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


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
        MalformedFrameError: Too large, too deep, a too long integer, NaN/Infinity, not UTF-8,
            not JSON, or not an object (one line; the content is not quoted).
    """
    if len(data) > max_bytes:
        raise MalformedFrameError(
            f"{peer} sent a {what} of {len(data)} bytes; at most {max_bytes} are allowed"
        )
    depth = nesting_depth(data)
    if depth > MAX_DEPTH:
        raise MalformedFrameError(
            f"{peer} sent a {what} nested {depth} levels deep; at most {MAX_DEPTH} are allowed"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedFrameError(f"{peer} sent a {what} that is not JSON (not UTF-8)") from None
    try:
        doc = json.loads(text, parse_int=_parse_int, parse_constant=_parse_constant)
    except _Rejected as exc:
        raise MalformedFrameError(f"{peer} sent a {what} with {exc}; refused") from None
    except (json.JSONDecodeError, RecursionError, ValueError) as exc:
        reason = type(exc).__name__ if isinstance(exc, RecursionError) else str(exc)[:200]
        raise MalformedFrameError(f"{peer} sent a {what} that is not JSON: {reason}") from None
    if not isinstance(doc, dict):
        raise MalformedFrameError(f"{peer} sent a {what} that is not a JSON object")
    return doc
