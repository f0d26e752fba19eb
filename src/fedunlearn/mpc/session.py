"""Session binding: the first message on every link says who speaks, for which session and job.

Every link (server to server, server to dealer, server to clients) opens with a *hello* from
each side: protocol name and version, the sender's role, a session id, named digests of the job
and the link's protocol options. ``SessionBinding`` holds the session id and the named digests
(e.g. ``run_config``, ``forget_set``, ``trajectory``, ``share_store``; the caller chooses the
names and computes the digests, e.g. with ``digest``), and ``SessionBinding.check`` compares
two of them field by field and raises ``SessionMismatchError`` naming every field that differs.

The dealer never needs the job's details, so a server sends it ``binding.for_dealer()``: the
session id and one digest ``job`` over all named digests. Because the share-store digest is
among them (uniform shares: high entropy), the dealer cannot test guesses of, say, the forget
set against it, yet it still refuses two servers that run different jobs.

Hellos are small JSON documents in one uint8 frame (at most ``MAX_HELLO_BYTES``), validated
field by field before anything is compared.

What a hello reveals: docs/security.md.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedunlearn.errors import MalformedFrameError, SessionMismatchError
from fedunlearn.mpc.wire import parse_object, peer_text

__all__ = [
    "MAX_HELLO_BYTES",
    "Hello",
    "PROTOCOL",
    "PROTOCOL_VERSION",
    "SessionBinding",
    "decode_message",
    "digest",
    "encode_message",
    "mismatch_error",
]

PROTOCOL = "fedunlearn-mpc"
PROTOCOL_VERSION = 2
MAX_HELLO_BYTES = 16 * 1024
_SESSION = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
_HEX = re.compile(r"^[0-9a-f]{8,128}$")
_HINT = (
    "Start every process of a session with the same session id, run, configuration, forget "
    "set and share stores."
)
Option = int | float | str | bool


def digest(data: bytes | str | Mapping[str, Any] | list) -> str:
    """SHA-256 hex digest of bytes, a string, or a JSON-able value (canonical: sorted keys)."""
    if isinstance(data, str):
        data = data.encode()
    elif not isinstance(data, bytes | bytearray | memoryview):
        data = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class SessionBinding:
    """A session id and named digests of the job, compared at the start of every link.

    Args:
        session_id: Names this run of the deployment (1-128 characters of ``[A-Za-z0-9._:-]``);
            every process of the session is started with the same one.
        digests: Name -> lowercase hex digest (e.g. ``{"run_config": ..., "forget_set": ...}``).

    Raises:
        ValueError: A session id, digest name or digest value is malformed.
    """

    session_id: str
    digests: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.session_id, str) or not _SESSION.match(self.session_id):
            raise ValueError(
                "a session id has 1-128 characters of [A-Za-z0-9._:-]; got "
                + peer_text(repr(self.session_id), 140)
            )
        for name, value in self.digests.items():
            if not isinstance(name, str) or not _NAME.match(name):
                raise ValueError(
                    "digest names are identifiers of <= 64 characters; got "
                    + peer_text(repr(name), 80)
                )
            if not isinstance(value, str) or not _HEX.match(value):
                raise ValueError(
                    f"digest {name!r} must be 8-128 lowercase hex digits; got "
                    + peer_text(repr(value), 140)
                )
        object.__setattr__(self, "digests", dict(sorted(self.digests.items())))

    @classmethod
    def unbound(cls) -> SessionBinding:
        """The binding of callers that bind nothing (tests, legacy callers): all of them agree."""
        return cls("unbound")

    def job_digest(self) -> str:
        """One digest over all named digests (what the dealer sees)."""
        return digest(dict(self.digests))

    def for_dealer(self) -> SessionBinding:
        """The binding to show the dealer: the session id and one ``job`` digest."""
        if set(self.digests) <= {"job"}:
            return self
        return SessionBinding(self.session_id, {"job": self.job_digest()})

    def to_json(self) -> dict[str, Any]:
        """The binding as JSON fields of a hello."""
        return {"session": self.session_id, "digests": dict(self.digests)}

    def check(self, theirs: SessionBinding, peer: str) -> None:
        """Raise ``SessionMismatchError`` naming every field in which ``theirs`` differs.

        Args:
            theirs: The peer's binding.
            peer: How the message names the peer (``server1 at 10.0.0.2:4711``).
        """
        differences = self.differences(theirs)
        if differences:
            raise mismatch_error(peer, differences, _HINT)

    def differences(self, theirs: SessionBinding) -> dict[str, tuple[str | None, str | None]]:
        """Field -> (ours, theirs) for the session id and each digest that differs or is missing."""
        out: dict[str, tuple[str | None, str | None]] = {}
        if self.session_id != theirs.session_id:
            out["session_id"] = (self.session_id, theirs.session_id)
        for name in sorted(set(self.digests) | set(theirs.digests)):
            mine, other = self.digests.get(name), theirs.digests.get(name)
            if mine != other:
                out[f"digest {name}"] = (mine, other)
        return out


def _short(value: object) -> str:
    if value is None:
        return "missing"
    if not isinstance(value, str):
        return str(value)
    text = value
    return repr(text[:12] + "...") if len(text) > 16 else repr(text)


def mismatch_error(
    peer: str, differences: Mapping[str, tuple[object, object]], hint: str
) -> SessionMismatchError:
    """A ``SessionMismatchError`` that names every differing field (ours vs theirs)."""
    fields = "; ".join(
        f"{name}: ours {_short(mine)}, theirs {_short(other)}"
        for name, (mine, other) in differences.items()
    )
    return SessionMismatchError(
        f"{peer} runs another session or job; differing fields: {fields}. {hint}",
        dict(differences),
    )


def encode_message(doc: Mapping[str, Any]) -> np.ndarray:
    """A small JSON document as one uint8 frame."""
    data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    if len(data) > MAX_HELLO_BYTES:
        raise ValueError(
            f"a handshake message has at most {MAX_HELLO_BYTES} bytes; got {len(data)}"
        )
    return np.frombuffer(data, dtype=np.uint8).copy()


def decode_message(frame: np.ndarray, peer: str) -> dict[str, Any]:
    """Parse a handshake message; ``MalformedFrameError`` unless it is a JSON object."""
    if frame.dtype != np.uint8 or frame.ndim != 1 or frame.size > MAX_HELLO_BYTES:
        raise MalformedFrameError(
            f"{peer} sent a {frame.dtype} frame of shape {frame.shape} where a handshake message "
            f"(uint8 JSON, <= {MAX_HELLO_BYTES} bytes) belongs"
        )
    return parse_object(frame.tobytes(), peer, max_bytes=MAX_HELLO_BYTES, what="handshake message")


@dataclass(frozen=True)
class Hello:
    """A parsed hello: the sender's claimed role, its binding and its protocol options."""

    role: str
    binding: SessionBinding
    options: Mapping[str, Option]

    def to_json(self) -> dict[str, Any]:
        """The hello as a JSON document."""
        return {
            "protocol": PROTOCOL,
            "version": PROTOCOL_VERSION,
            "role": self.role,
            **self.binding.to_json(),
            "options": dict(self.options),
        }

    @classmethod
    def parse(cls, doc: Mapping[str, Any], peer: str) -> Hello:
        """Validate a hello document field by field.

        Raises:
            MalformedFrameError: Wrong protocol or version, or a field of the wrong type.
        """
        if doc.get("protocol") != PROTOCOL or doc.get("version") != PROTOCOL_VERSION:
            raise MalformedFrameError(
                f"{peer} speaks protocol {peer_text(repr(doc.get('protocol')), 80)} version "
                f"{peer_text(repr(doc.get('version')), 40)}; this side speaks {PROTOCOL!r} "
                f"version {PROTOCOL_VERSION}. Run the same fedunlearn version on every process."
            )
        options = doc.get("options", {})
        role = doc.get("role")
        if not isinstance(role, str) or not _NAME.match(role) or not isinstance(options, dict):
            raise MalformedFrameError(f"{peer} sent a hello without a role or with bad options")
        if (
            len(options) > 64
            or not all(isinstance(v, Option) for v in options.values())
            or not all(_NAME.match(name) for name in options)
        ):
            raise MalformedFrameError(
                f"{peer} sent options that are not at most 64 named flat scalars"
            )
        digests = doc.get("digests", {})
        if not isinstance(digests, dict):
            raise MalformedFrameError(f"{peer} sent digests that are not an object")
        try:
            binding = SessionBinding(doc.get("session"), digests)  # type: ignore[arg-type]
        except ValueError as exc:
            raise MalformedFrameError(f"{peer} sent a malformed session binding: {exc}") from None
        return cls(role, binding, dict(options))

    def differences(self, theirs: Hello) -> dict[str, tuple[object, object]]:
        """Binding and option fields that differ, as (ours, theirs)."""
        out: dict[str, tuple[object, object]] = dict(self.binding.differences(theirs.binding))
        for name in sorted(set(self.options) | set(theirs.options)):
            mine, other = self.options.get(name), theirs.options.get(name)
            if mine != other:
                out[f"option {name}"] = (mine, other)
        return out
