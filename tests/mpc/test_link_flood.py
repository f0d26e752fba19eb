"""A connection flood cannot starve a TLS session; a late listener is joined (issue 25).

Issue 25: 32 idle TCP connections filled a listener's handshake slots, the real server was
closed at once and never retried, and a listener that started accepting after the peer's
handshake bound had passed failed the session. Real sockets on 127.0.0.1 (the flood comes from
127.0.0.2, another loopback address, so the per-address cap has an address to cap), a real
mutual-TLS link built with the trial PKI.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

import numpy as np
import pytest
from tests.support.flood import Flood

from fedunlearn.errors import PeerDisconnectedError
from fedunlearn.mpc import (
    Identity,
    LinkLimits,
    Security,
    SessionBinding,
    TcpListener,
    accept_peer,
    connect_peer,
    create_trial_pki,
)
from fedunlearn.mpc.link import MAX_PENDING_PER_ADDRESS

FLOOD_SECONDS = 25.0  # the flood stops by itself after this, whatever happens
BINDING = SessionBinding("flood-run", {"job": "0" * 64})


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pki")
    create_trial_pki(directory)
    return directory


def connect_server1(port, pki, results, **limits):
    try:
        link = connect_peer(
            ("127.0.0.1", port),
            security=Security(identity=Identity.from_directory(pki, "server1")),
            role="server1",
            peer_roles={"server0"},
            binding=BINDING,
            limits=LinkLimits(**{"timeout_seconds": 20, **limits}),
        )
        results.append(("ok", link.transport.exchange(np.arange(4, dtype=np.uint64)).tolist()))
        link.close()
    except Exception as exc:  # reported to the test
        results.append((type(exc).__name__, str(exc)))


def accept_server1(listener, pki, accept_timeout_seconds=25):
    return accept_peer(
        listener,
        security=Security(identity=Identity.from_directory(pki, "server0")),
        role="server0",
        peer_role="server1",
        binding=BINDING,
        limits=LinkLimits(
            timeout_seconds=10,
            accept_timeout_seconds=accept_timeout_seconds,
            handshake_timeout_seconds=1.0,
            first_byte_seconds=0.5,
        ),
    )


@pytest.mark.slow
def test_a_session_completes_during_a_flood_of_200_idle_and_slow_connections(pki, caplog):
    try:  # the flood's own loopback address (Linux routes all of 127/8 to lo)
        socket.create_server(("127.0.0.2", 0)).close()
    except OSError:
        pytest.skip("127.0.0.2 is not a local address here")
    # Prepare: server 0 listens; 200 connections from another address are kept open
    # (re-opened when closed) for a second before server 1 starts, and while it joins
    listener = TcpListener("127.0.0.1", 0)
    results: list = []
    served: list = []

    def server0():
        try:
            link = accept_server1(listener, pki)
            served.append(link.transport.exchange(np.full(4, 7, dtype=np.uint64)).tolist())
            link.close()
        except Exception as exc:  # reported to the test
            served.append(f"{type(exc).__name__}: {exc}")

    acceptor = threading.Thread(target=server0)
    peer = threading.Thread(target=connect_server1, args=(listener.port, str(pki), results))
    try:
        with (
            caplog.at_level(logging.WARNING, logger="fedunlearn.mpc.link"),
            Flood([listener.address], 200, FLOOD_SECONDS) as flood,
        ):
            acceptor.start()
            end = time.monotonic() + 5.0
            while flood.opened < 200 and time.monotonic() < end:  # the flood first
                time.sleep(0.1)
            time.sleep(1.0)  # twice the first-byte limit: idle ones have been dropped once
            # Execute: the real server 1 joins while the flood goes on
            start = time.monotonic()
            peer.start()
            peer.join(20)
            acceptor.join(20)
            elapsed = time.monotonic() - start
            opened = flood.opened
    finally:
        listener.close()
    # Assert: the session completed; the flood was capped per address, idle ones dropped early
    assert results == [("ok", [7, 7, 7, 7])]
    assert served == [[0, 1, 2, 3]]
    assert opened >= 200
    messages = [r.getMessage() for r in caplog.records]
    capped = f"more than {MAX_PENDING_PER_ADDRESS} connections handshaking from 127.0.0.2"
    assert sum(capped in m for m in messages) >= 100
    assert any("sent nothing within" in m for m in messages)  # idle ones freed their slot
    assert elapsed < 15


def test_a_peer_closed_at_once_by_a_full_listener_retries_and_joins(pki):
    # Prepare: a one-shot flood from the peer's own address fills its per-address slots, so
    # the real peer's first attempts are closed at once (it used to give up there)
    listener = TcpListener("127.0.0.1", 0)
    idle = []
    for _ in range(40):
        sock = socket.create_connection(listener.address, timeout=2)
        idle.append(sock)
    results: list = []
    peer = threading.Thread(target=connect_server1, args=(listener.port, str(pki), results))
    try:
        peer.start()
        link = accept_server1(listener, pki)
        got = link.transport.exchange(np.full(4, 7, dtype=np.uint64))
        peer.join(20)
        link.close()
    finally:
        for sock in idle:
            sock.close()
        listener.close()
    assert results == [("ok", [7, 7, 7, 7])]
    assert got.tolist() == [0, 1, 2, 3]


@pytest.mark.slow
def test_a_listener_that_starts_accepting_late_is_joined_within_the_deadline(pki):
    # Prepare: the port is bound (as starfish-local hands it over), nobody accepts for 2 s,
    # four times the peer's handshake bound (which used to fail the session)
    listener = TcpListener("127.0.0.1", 0)
    results: list = []
    peer = threading.Thread(
        target=connect_server1,
        args=(listener.port, str(pki), results),
        kwargs={"handshake_timeout_seconds": 0.5, "join_timeout_seconds": 15},
    )
    try:
        peer.start()
        time.sleep(2.0)
        # Execute
        link = accept_server1(listener, pki)
        got = link.transport.exchange(np.full(4, 7, dtype=np.uint64))
        peer.join(20)
        link.close()
    finally:
        listener.close()
    assert results == [("ok", [7, 7, 7, 7])]
    assert got.tolist() == [0, 1, 2, 3]


@pytest.mark.slow
def test_a_peer_gives_up_at_its_join_deadline_when_nobody_listens():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(PeerDisconnectedError, match="within 1 s"):
        connect_peer(
            ("127.0.0.1", port),
            security=Security.plain(),
            role="server1",
            peer_roles={"server0"},
            limits=LinkLimits(timeout_seconds=20, join_timeout_seconds=1.0),
        )
    assert time.monotonic() - start < 5


@pytest.mark.slow
def test_a_refusal_with_a_reason_is_final_not_retried(pki, tmp_path):
    # a listener of another deployment's CA: TLS fails for a reason, so the peer stops at once
    # instead of retrying until its join deadline
    other = tmp_path / "other-pki"
    create_trial_pki(other)
    listener = TcpListener("127.0.0.1", 0)
    served: list = []

    def server0():
        try:
            accept_server1(listener, other, accept_timeout_seconds=3)
        except Exception as exc:  # expected: nobody authenticated joins
            served.append(type(exc).__name__)

    acceptor = threading.Thread(target=server0)
    acceptor.start()
    results: list = []
    start = time.monotonic()
    try:
        connect_server1(listener.port, str(pki), results, join_timeout_seconds=15)
        elapsed = time.monotonic() - start
    finally:
        acceptor.join(10)
        listener.close()
    assert results, results
    assert results[0][0] == "PeerAuthenticationError", results
    assert elapsed < 4
    assert served == ["PeerDisconnectedError"]
