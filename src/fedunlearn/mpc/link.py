"""Authenticated links: accept until the expected peers arrive, connect with roles and a hello.

``accept_peers`` is how every service of a deployment (server 0 for server 1, the dealer for
both servers, the clients service for both servers) takes its connections:

1. It keeps accepting on the listening socket until every expected role has arrived or
   ``accept_timeout_seconds`` have passed. Each connection is handshaken in its own thread:
   its first byte must arrive within ``first_byte_seconds`` (an idle connection frees its slot
   quickly), and the whole handshake (TLS, then one hello frame of at most 16 KiB) ends within
   ``handshake_timeout_seconds`` (a watchdog shuts a slow drip down). At most ``MAX_PENDING``
   connections handshake at once, at most ``MAX_PENDING_PER_ADDRESS`` from one address; more
   are closed at once. Junk (garbage bytes, a failed TLS handshake, a slow drip, an oversized
   or malformed hello, a certificate of another CA) is closed and logged, and never ends the
   session.
2. With an ``Identity`` (mutual TLS) the peer's role is the one its certificate binds; a
   certificate of an unexpected role (say ``clients`` at the dealer), or a hello claiming
   another role than the certificate, is refused with a message saying so. Each role is
   served once: a second peer of a role that already arrived is refused. Without TLS
   (``Security.plain()``) the role is what the hello claims, and nothing stops a third party from
   claiming it first (``identity.INSECURE_WARNING``).
3. The acceptor answers an accepted peer with its own hello; both sides compare session id,
   digests and protocol options (``session.Hello.differences``). A difference with an
   authenticated peer is fatal on both sides: ``SessionMismatchError`` naming the fields.
4. Once all roles are in, each peer receives ``{"ready": true}``; if the session fails first
   (a mismatch, the deadline), the peers already accepted receive the reason instead.

``connect_peer`` is the other end: connect, TLS with the expected role(s) of the peer, send the
hello, compare the answer, wait for ``ready``. Until ``join_timeout_seconds`` have passed it
retries every attempt that failed for want of a listener (refused, closed at once because the
listener's handshake slots were full of a flood, reset, or a handshake that timed out because
the listener had not started accepting yet), with a backoff of at most 1 s; a refusal with a
reason (wrong role, other session, wrong CA) is final.

Both return ``Link``s whose ``transport`` is a ``TcpTransport`` with the caller's timeouts and
frame cap (the handshake itself runs under a 16 KiB cap).

Every bound above is a field of ``security.LinkLimits``, and the security of the link (a TLS
identity, or explicitly plain TCP) is one ``security.Security``: both functions take one of
each. Why each link must reach the party it is meant for (two non-colluding servers and a
trusted dealer): docs/security.md.
"""

from __future__ import annotations

import logging
import queue
import socket
import ssl
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from fedunlearn.errors import (
    ConfigError,
    FedUnlearnError,
    MalformedFrameError,
    PeerAuthenticationError,
    PeerDisconnectedError,
    SessionMismatchError,
)
from fedunlearn.mpc.identity import ROLES
from fedunlearn.mpc.security import DEFAULT_LIMITS, FIRST_BYTE_SECONDS, LinkLimits, Security
from fedunlearn.mpc.session import (
    MAX_HELLO_BYTES,
    Hello,
    Option,
    SessionBinding,
    decode_message,
    encode_message,
    mismatch_error,
)
from fedunlearn.mpc.tcp import TcpListener, TcpTransport, connect_socket
from fedunlearn.mpc.wire import peer_text

__all__ = [
    "FIRST_BYTE_SECONDS",
    "MAX_PENDING",
    "MAX_PENDING_PER_ADDRESS",
    "Link",
    "accept_peer",
    "accept_peers",
    "check_ready",
    "connect_peer",
]

logger = logging.getLogger("fedunlearn.mpc.link")
MAX_PENDING = 32  # connections handshaking at once; more are closed at once
MAX_PENDING_PER_ADDRESS = 8  # of them from one IP address, so one host cannot take every slot
_RETRY_BACKOFF_SECONDS = (0.05, 1.0)  # connect_peer's first and largest pause between attempts
_LINGER_SECONDS = 2.0  # after a refusal or abort, let the message reach the peer
_MAX_REFUSALS_KEPT = 20
_HINT = (
    "Start every process of a session with the same session id, run, configuration, forget "
    "set and share stores (and the same protocol options)."
)


@dataclass
class Link:
    """An accepted or connected link after the handshake.

    Attributes:
        transport: The framed connection (caller's timeouts and frame cap).
        role: The peer's role: from its certificate, or (plain TCP) from its hello.
        hello: The peer's hello (binding and options).
        authenticated: True if ``role`` was proven by a certificate.
    """

    transport: TcpTransport
    role: str
    hello: Hello
    authenticated: bool
    where: str = "the peer"

    def wait_ready(self, timeout_seconds: float) -> None:
        """Wait for the service's ready message (``connect_peer(wait_ready=False)``)."""
        previous = self.transport.timeout_seconds
        self.transport.set_timeout(timeout_seconds)
        try:
            check_ready(_receive_doc(self.transport, self.where), self.where)
        except BaseException:
            self.transport.close()
            raise
        self.transport.set_timeout(previous)

    def close(self) -> None:
        """Close the transport."""
        self.transport.close()


def _send_doc(transport: TcpTransport, doc: Mapping[str, object]) -> None:
    transport.send(encode_message(doc))


def _try_send_doc(transport: TcpTransport, doc: Mapping[str, object]) -> None:
    try:
        _send_doc(transport, doc)
    except FedUnlearnError:
        pass


def _refusal(kind: str, reason: str) -> dict[str, str]:
    return {"refused": kind, "reason": reason}


@dataclass
class _Candidate:
    transport: TcpTransport
    role: str
    hello: Hello
    authenticated: bool
    where: str


class _Refused(Exception):
    """A connection was refused during its handshake (reason for the log)."""


def _handshake_incoming(
    conn: socket.socket,
    address: tuple,
    security: Security,
    peer_roles: Collection[str],
    party_id: int,
    handshake_timeout_seconds: float,
    first_byte_seconds: float = FIRST_BYTE_SECONDS,
) -> _Candidate:
    """TLS (if any), the peer's role, its hello: everything but the session comparison.

    The first byte must come within ``first_byte_seconds``; a watchdog shuts the connection
    down when ``handshake_timeout_seconds`` have passed in all (socket timeouts bound each
    read only, so a drip of one byte per second would otherwise last).
    """
    where = f"{address[0]}:{address[1]}"
    conn.settimeout(min(first_byte_seconds, handshake_timeout_seconds))
    try:
        first = conn.recv(1, socket.MSG_PEEK)
    except OSError:
        first = b""
    if not first:
        conn.close()
        raise _Refused(f"sent nothing within {first_byte_seconds:g} s (idle connection)")
    watch = conn.dup()  # shutting a duplicate down ends the blocked handshake on ``conn``
    watchdog = threading.Timer(handshake_timeout_seconds, _shut_down, (watch,))
    watchdog.daemon = True
    watchdog.start()
    try:
        return _handshake_after_first_byte(
            conn, where, security, peer_roles, party_id, handshake_timeout_seconds
        )
    finally:
        watchdog.cancel()
        watch.close()


def _shut_down(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _handshake_after_first_byte(
    conn: socket.socket,
    where: str,
    security: Security,
    peer_roles: Collection[str],
    party_id: int,
    handshake_timeout_seconds: float,
) -> _Candidate:
    cert_role: str | None = None
    try:
        if security.identity is not None:
            conn, cert_role = security.identity.wrap_server(
                conn, ROLES, timeout_seconds=handshake_timeout_seconds, where=where
            )
    except (PeerAuthenticationError, ssl.SSLError, OSError) as exc:
        conn.close()
        raise _Refused(f"TLS handshake failed: {exc}") from None
    transport = TcpTransport(
        conn,
        party_id,
        handshake_timeout_seconds,
        MAX_HELLO_BYTES,
        peer_name=f"{cert_role or 'an unauthenticated peer'} at {where}",
    )
    try:  # read the hello first: a refusal then reaches the peer instead of a reset
        hello = Hello.parse(decode_message(transport.recv(MAX_HELLO_BYTES), where), where)
        problem = None
        if cert_role is not None and cert_role not in peer_roles:
            problem = (
                f"this link accepts only {', '.join(sorted(peer_roles))}; your certificate is "
                f"for role {cert_role!r}"
            )
        elif cert_role is not None and hello.role != cert_role:
            problem = (
                f"your hello claims role {hello.role!r} but your certificate is for {cert_role!r}"
            )
        elif cert_role is None and hello.role not in peer_roles:
            problem = (
                f"this link accepts only {', '.join(sorted(peer_roles))}; you claim {hello.role!r}"
            )
        if problem is not None:
            _try_send_doc(transport, _refusal("role", problem))
            transport.close(_LINGER_SECONDS)  # this is the handshake thread: linger here
            raise _Refused(f"{problem} (refused)")
    except _Refused:
        raise
    except FedUnlearnError as exc:  # silent, slow, malformed: junk
        transport.close()
        raise _Refused(f"{type(exc).__name__}: {exc}") from None
    return _Candidate(transport, hello.role, hello, cert_role is not None, where)


def accept_peers(
    listener: TcpListener | socket.socket,
    *,
    role: str,
    peer_roles: Collection[str],
    security: Security,
    binding: SessionBinding | None = None,
    options: Mapping[str, Option] | None = None,
    party_id: int = 0,
    limits: LinkLimits = DEFAULT_LIMITS,
    adopt_binding: bool = False,
) -> dict[str, Link]:
    """Accept until one authenticated peer of each role in ``peer_roles`` has joined.

    Args:
        listener: The listening socket (left open; close it when no one else may join).
        role: This process's role (sent in its hello; must match its certificate).
        peer_roles: Roles to wait for, one peer each.
        security: Mutual TLS with roles (the secure setting), or explicitly plain TCP.
        binding: This session's binding (default ``SessionBinding.unbound()``).
        options: Protocol options both sides must agree on (e.g. ``mask_scale_bits``).
        party_id: Passed to the transports.
        limits: Receive timeout and frame cap of the returned transports
            (``timeout_seconds``, ``max_frame_bytes``), how long to wait for all roles
            (``accept_timeout_seconds``), the bound on one handshake
            (``handshake_timeout_seconds``) and on its first byte (``first_byte_seconds``).
        adopt_binding: Take the first accepted peer's binding as this session's (a dealer that
            only checks that both servers agree); ``binding`` must then be None.

    Returns:
        Role -> ``Link``.

    Raises:
        SessionMismatchError: An authenticated peer runs another session or job.
        PeerDisconnectedError: Not all roles arrived in time (the message lists refusals).
        ConfigError: The certificate binds another role than ``role``.
    """
    if security.identity is not None and security.identity.role != role:
        raise ConfigError(
            f"this process speaks as {role!r} but its certificate is for {security.identity.role!r}"
        )
    wanted = set(peer_roles)
    if not wanted or not wanted <= set(ROLES):
        raise ConfigError(f"peer_roles must be a non-empty subset of {ROLES}; got {peer_roles!r}")
    if adopt_binding and binding is not None:
        raise ConfigError("adopt_binding takes the first peer's binding: pass binding=None")
    current = binding if binding is not None or adopt_binding else SessionBinding.unbound()
    sock = listener.sock if isinstance(listener, TcpListener) else listener
    session = _Acceptance(
        sock, role, wanted, security, current, dict(options or {}), party_id, limits
    )
    try:
        session.run()
    except BaseException as exc:
        if not session.done.is_set():
            session.abort(f"{role} failed: {type(exc).__name__}: {exc}")
        raise
    finally:
        session.done.set()
        _drain_late(session.results)
    for link in session.accepted.values():
        _try_send_doc(link.transport, {"ready": True})
    return session.accepted


class _Acceptance:
    """The state of one ``accept_peers`` call: slots, handshake threads, accepted links."""

    def __init__(
        self,
        sock: socket.socket,
        role: str,
        wanted: set[str],
        security: Security,
        current: SessionBinding | None,
        own_options: dict[str, Option],
        party_id: int,
        limits: LinkLimits,
    ) -> None:
        self.sock = sock
        self.host, self.port = sock.getsockname()[:2]
        self.role, self.wanted, self.security = role, wanted, security
        self.current, self.own_options = current, own_options
        self.party_id, self.limits = party_id, limits
        self.results: queue.Queue = queue.Queue()
        self.pending = 0
        self.per_address: dict[str, int] = {}
        self.lock = threading.Lock()
        self.accepted: dict[str, Link] = {}
        self.refusals: list[str] = []
        self.refused_count = 0
        self.done = threading.Event()

    def work(self, conn: socket.socket, address: tuple) -> None:
        """Handshake one connection (in its own thread) and post the outcome."""
        limits = self.limits
        try:
            self.results.put(
                _handshake_incoming(
                    conn,
                    address,
                    self.security,
                    self.wanted,
                    self.party_id,
                    limits.handshake_timeout_seconds,
                    limits.first_byte_seconds,
                )
            )
        except _Refused as exc:
            self.results.put((f"{address[0]}:{address[1]}", str(exc)))
        except Exception as exc:  # a bug must not hang the accept loop
            conn.close()
            self.results.put(
                (f"{address[0]}:{address[1]}", f"internal error {type(exc).__name__}: {exc}")
            )
        finally:
            with self.lock:
                self.pending -= 1
                self.per_address[address[0]] -= 1
                if not self.per_address[address[0]]:
                    del self.per_address[address[0]]

    def refuse(self, where: str, reason: str) -> None:
        """Count and log a refused connection (the last few are kept for the timeout error)."""
        self.refused_count += 1
        text = f"{where}: {reason}"
        self.refusals.append(text)
        del self.refusals[:-_MAX_REFUSALS_KEPT]
        logger.warning(
            "%s on %s:%s refused a connection from %s", self.role, self.host, self.port, text
        )

    def abort(self, reason: str) -> None:
        """End the session: tell the peers already accepted why."""
        self.done.set()
        for link in self.accepted.values():
            _try_send_doc(link.transport, {"abort": reason})
            link.transport.close(_LINGER_SECONDS, background=True)

    def run(self) -> None:
        """Accept and admit connections until every wanted role has joined or time is up."""
        accept_timeout_seconds = self.limits.accept_timeout_seconds
        deadline = time.monotonic() + accept_timeout_seconds
        while set(self.accepted) != self.wanted:
            now = time.monotonic()
            if now >= deadline:
                missing = ", ".join(sorted(self.wanted - set(self.accepted)))
                last = "; ".join(self.refusals[-3:]) or "none"
                reason = (
                    f"no authenticated {missing} joined {self.role} on {self.host}:{self.port} "
                    f"within {accept_timeout_seconds:g} s ({self.refused_count} connections "
                    f"refused; last: {last})"
                )
                self.abort(reason)
                raise PeerDisconnectedError(reason)
            self.take_finished()
            if set(self.accepted) == self.wanted:
                break
            self.sock.settimeout(min(0.05, max(deadline - now, 0.001)))
            try:
                conn, address = self.sock.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                self.abort(f"{self.role} stopped listening: {exc}")
                raise PeerDisconnectedError(
                    f"{self.role}'s listener on {self.host}:{self.port} failed: {exc}"
                ) from exc
            if self.take_slot(conn, address):
                threading.Thread(
                    target=self.work,
                    args=(conn, address),
                    name=f"{self.role}-handshake",
                    daemon=True,
                ).start()

    def take_slot(self, conn: socket.socket, address: tuple) -> bool:
        """Reserve a handshake slot for ``conn``, or close and refuse it if none is free."""
        with self.lock:
            full = self.pending >= MAX_PENDING
            crowded = self.per_address.get(address[0], 0) >= MAX_PENDING_PER_ADDRESS
            if not (full or crowded):
                self.pending += 1
                self.per_address[address[0]] = self.per_address.get(address[0], 0) + 1
                return True
        conn.close()  # a real peer retries (connect_peer) until its join deadline
        reason = (
            f"more than {MAX_PENDING} connections handshaking at once"
            if full
            else f"more than {MAX_PENDING_PER_ADDRESS} connections handshaking from {address[0]}"
        )
        self.refuse(f"{address[0]}:{address[1]}", reason)
        return False

    def take_finished(self) -> None:
        """Admit or refuse the handshakes that finished; a session mismatch is fatal."""
        while True:
            try:
                item = self.results.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, tuple):
                self.refuse(*item)
                continue
            if item.role in self.accepted:
                _try_send_doc(
                    item.transport,
                    _refusal("taken", f"role {item.role} has already joined this session"),
                )
                item.transport.close(_LINGER_SECONDS, background=True)
                self.refuse(item.where, f"second peer for role {item.role}")
                continue
            if self.current is None:  # adopt_binding: the first peer's session is ours
                self.current = item.hello.binding
            ours = Hello(self.role, self.current, self.own_options)
            _try_send_doc(item.transport, ours.to_json())
            differences = ours.differences(item.hello)
            if differences:
                error = mismatch_error(f"{item.role} at {item.where}", differences, _HINT)
                item.transport.close(_LINGER_SECONDS, background=True)
                self.abort(f"the session was refused: {error}")
                raise error
            item.transport.set_timeout(self.limits.timeout_seconds)
            item.transport.max_frame_bytes = int(self.limits.max_frame_bytes)
            self.accepted[item.role] = Link(
                item.transport, item.role, item.hello, item.authenticated, item.where
            )


def _drain_late(results: queue.Queue) -> None:
    """Close handshakes that finished after the session was complete or failed."""

    def drain() -> None:
        end = time.monotonic() + 30.0
        while time.monotonic() < end:
            try:
                item = results.get(timeout=1.0)
            except queue.Empty:
                continue
            if not isinstance(item, tuple):
                _try_send_doc(item.transport, _refusal("taken", "the session is complete"))
                item.transport.close(_LINGER_SECONDS)

    threading.Thread(target=drain, name="late-handshakes", daemon=True).start()


def accept_peer(
    listener: TcpListener | socket.socket,
    *,
    role: str,
    peer_role: str,
    security: Security,
    binding: SessionBinding | None = None,
    options: Mapping[str, Option] | None = None,
    party_id: int = 0,
    limits: LinkLimits = DEFAULT_LIMITS,
) -> Link:
    """``accept_peers`` for one role (e.g. server 0 waiting for server 1); see there."""
    links = accept_peers(
        listener,
        role=role,
        peer_roles={peer_role},
        security=security,
        binding=binding,
        options=options,
        party_id=party_id,
        limits=limits,
    )
    return links[peer_role]


def connect_peer(
    address: tuple[str, int],
    *,
    role: str,
    peer_roles: Collection[str],
    security: Security,
    binding: SessionBinding | None = None,
    options: Mapping[str, Option] | None = None,
    party_id: int = 1,
    limits: LinkLimits = DEFAULT_LIMITS,
    wait_ready: bool = True,
) -> Link:
    """Connect to a service, authenticate its role, exchange hellos, wait until it is ready.

    Args:
        address: (host, port) of the listening peer.
        role: This process's role.
        peer_roles: Roles the peer may have (e.g. ``{"dealer"}``).
        security: Mutual TLS with roles (the secure setting), or explicitly plain TCP.
        binding: This session's binding (default ``SessionBinding.unbound()``).
        options: Protocol options both sides must agree on.
        party_id: Passed to the transport.
        limits: Receive timeout and frame cap of the returned transport
            (``timeout_seconds``, ``max_frame_bytes``), the bound on the TLS handshake and
            the hello answer, how long to wait for the service's other peers
            (``ready_timeout_seconds``) and how long to keep retrying attempts that found no
            listener ready (``join_timeout_seconds``; refused, closed at once, reset, stalled
            handshake); both default to ``timeout_seconds``.
        wait_ready: Wait here until the service is ready (all its peers joined). With False
            the caller must call ``link.wait_ready()`` (or read the ready message itself)
            before anything else.

    Returns:
        The link.

    Raises:
        PeerAuthenticationError: TLS failed, the peer's role is not in ``peer_roles``, or the
            service refused this process's role.
        SessionMismatchError: The service runs another session or job (fields named).
        PeerDisconnectedError: No listener answered within the join window, or the service
            went away before it was ready.
    """
    if security.identity is not None and security.identity.role != role:
        raise ConfigError(
            f"this process speaks as {role!r} but its certificate is for {security.identity.role!r}"
        )
    host, port = address
    where = f"{'/'.join(sorted(peer_roles))} at {host}:{port}"
    join_seconds = limits.join_seconds
    deadline = time.monotonic() + join_seconds
    ours = Hello(role, binding or SessionBinding.unbound(), dict(options or {}))
    pause, attempts = _RETRY_BACKOFF_SECONDS[0], 0
    while True:
        attempts += 1
        try:
            transport, cert_role, reply = _hello_attempt(
                security,
                address,
                where,
                peer_roles,
                ours,
                party_id,
                max(deadline - time.monotonic(), 0.05),
                limits.handshake_timeout_seconds,
            )
            break
        except _Retry as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PeerDisconnectedError(
                    f"could not join {where} within {join_seconds:g} s ({attempts} attempts; "
                    f"last: {exc}); start the listening party first"
                ) from exc.__cause__
            time.sleep(min(pause, left))
            pause = min(2 * pause, _RETRY_BACKOFF_SECONDS[1])
    try:
        _raise_refusal(reply, where)
        theirs = Hello.parse(reply, where)
        claimed_ok = (
            theirs.role == cert_role if cert_role is not None else theirs.role in peer_roles
        )
        if not claimed_ok:
            raise PeerAuthenticationError(
                f"{where} says it is {theirs.role!r}; expected {', '.join(sorted(peer_roles))}"
                + (f" (its certificate: {cert_role!r})" if cert_role else "")
            )
        differences = ours.differences(theirs)
        if differences:
            raise mismatch_error(where, differences, _HINT)
        link = Link(transport, theirs.role, theirs, cert_role is not None, where)
        if wait_ready:
            link.wait_ready(limits.ready_seconds)
    except BaseException:
        transport.close()
        raise
    transport.set_timeout(limits.timeout_seconds)
    transport.max_frame_bytes = int(limits.max_frame_bytes)
    return link


class _Retry(Exception):
    """An attempt to join failed for want of a listener; ``connect_peer`` tries again."""


# failures that say "nobody (ready) listens here", not "you are refused"
_TRANSIENT = (ConnectionError, TimeoutError, ssl.SSLEOFError, ssl.SSLZeroReturnError)


def _hello_attempt(
    security: Security,
    address: tuple[str, int],
    where: str,
    peer_roles: Collection[str],
    ours: Hello,
    party_id: int,
    connect_seconds: float,
    handshake_timeout_seconds: float,
) -> tuple[TcpTransport, str | None, dict]:
    """One attempt: connect, TLS, send our hello, read the answer (not yet judged).

    Raises:
        _Retry: The listener is not there (yet), was full and closed us, or stalled.
        PeerAuthenticationError: TLS refused for a reason (certificate, role).
    """
    host, port = address
    try:
        sock = connect_socket(host, port, connect_seconds)
    except PeerDisconnectedError as exc:
        raise _Retry(str(exc)) from exc
    except OSError as exc:
        raise _Retry(f"connect failed: {exc}") from exc
    cert_role: str | None = None
    if security.identity is not None:
        try:
            sock, cert_role = security.identity.wrap_client(
                sock, set(peer_roles), timeout_seconds=handshake_timeout_seconds, where=where
            )
        except PeerAuthenticationError as exc:
            if isinstance(exc.__cause__, _TRANSIENT):
                raise _Retry(f"TLS handshake: {exc.__cause__}") from exc
            raise
    transport = TcpTransport(
        sock, party_id, handshake_timeout_seconds, MAX_HELLO_BYTES, peer_name=where
    )
    try:
        _send_doc(transport, ours.to_json())
        return transport, cert_role, _receive_doc(transport, where)
    except PeerDisconnectedError as exc:  # closed or silent before any answer: no listener
        transport.close()
        raise _Retry(f"no answer to the hello: {exc}") from exc
    except BaseException:
        transport.close()
        raise


def check_ready(doc: Mapping[str, object], where: str) -> None:
    """Accept a service's ready message; raise what it says otherwise.

    Raises:
        SessionMismatchError: The service refused the session (another peer's job differs).
        PeerDisconnectedError: The service gave up (e.g. a peer never came).
        MalformedFrameError: Anything else.
    """
    if "abort" in doc:
        reason = peer_text(doc["abort"])
        kind = SessionMismatchError if "session was refused" in reason else PeerDisconnectedError
        raise kind(f"{where} gave up the session: {reason}")
    if doc.get("ready") is not True:
        fields = peer_text(", ".join(sorted(doc)), 100)
        raise MalformedFrameError(f"{where} sent fields {fields} where its 'ready' belongs")


def _receive_doc(transport: TcpTransport, where: str) -> dict:
    try:
        return decode_message(transport.recv(MAX_HELLO_BYTES), where)
    except PeerDisconnectedError as exc:
        if isinstance(exc.__cause__, ssl.SSLError):
            raise PeerAuthenticationError(
                f"{where} refused this process's certificate during the TLS handshake: "
                f"{exc.__cause__}"
            ) from exc
        raise


def _raise_refusal(reply: Mapping[str, object], where: str) -> None:
    if "refused" not in reply:
        return
    kind, reason = reply.get("refused"), peer_text(reply.get("reason", ""))
    if kind == "session":
        raise SessionMismatchError(f"{where} refused the session: {reason}")
    raise PeerAuthenticationError(
        f"{where} refused this connection ({peer_text(kind, 40)}): {reason}"
    )
