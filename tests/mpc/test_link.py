"""Authenticated links between real processes: junk survives, mismatched jobs are refused.

Issue 15: no link authenticated its peer's role (server 0 took the first TCP connection as its
peer), and mismatched runs failed only by chance.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time

import link_peers
import numpy as np
import pytest

from fedunlearn.errors import ConfigError, PeerDisconnectedError, SessionMismatchError
from fedunlearn.mpc import (
    LinkLimits,
    Security,
    SessionBinding,
    TcpListener,
    accept_peer,
    connect_peer,
    create_trial_pki,
    digest,
)

SPAWN = multiprocessing.get_context("spawn")
JOB = {"run_config": digest("config"), "forget_set": digest([3]), "share_store": digest(b"s")}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pki")
    create_trial_pki(directory)
    return directory


def start(target, *args):
    process = SPAWN.Process(target=target, args=args, daemon=True)
    process.start()
    return process


def stop(process):
    process.join(10)
    if process.is_alive():
        process.kill()
        process.join(5)


def accept_server1(listener, pki, binding=None, **kwargs):
    from fedunlearn.mpc import Identity

    return accept_peer(
        listener,
        security=Security(identity=Identity.from_directory(pki, "server0")),
        role="server0",
        peer_role="server1",
        binding=binding or SessionBinding("run-1", JOB),
        limits=LinkLimits(
            timeout_seconds=10, accept_timeout_seconds=15, handshake_timeout_seconds=1.0
        ),
        **kwargs,
    )


@pytest.mark.slow
def test_server0_waits_through_junk_for_the_authenticated_server1(pki, caplog):
    # Prepare: junk connections first (garbage, an oversized header, a slow drip, a silent
    # socket, TLS without a certificate), then the real server 1 in its own process
    listener = TcpListener("127.0.0.1", 0)
    address = listener.address
    junk = [
        threading.Thread(target=link_peers.junk_bytes, args=(address,)),
        threading.Thread(target=link_peers.oversized_header, args=(address,)),
        threading.Thread(target=link_peers.slow_drip, args=(address, 1.5)),
        threading.Thread(target=link_peers.silent, args=(address, 1.5)),
        threading.Thread(target=link_peers.tls_without_certificate, args=(address,)),
    ]
    for t in junk:
        t.start()
    results = SPAWN.Queue()
    peer = start(link_peers.server1, listener.port, str(pki), "run-1", JOB, results)
    try:
        # Execute
        start_time = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="fedunlearn.mpc.link"):
            link = accept_server1(listener, pki)
            got = link.transport.exchange(np.full(4, 7, dtype=np.uint64))
        elapsed = time.monotonic() - start_time
        status, theirs, their_view = results.get(timeout=20)
    finally:
        listener.close()
        stop(peer)
        for t in junk:
            t.join(10)
    # Assert: the authenticated peer got through; junk was refused and logged, not served
    assert (link.role, link.authenticated) == ("server1", True)
    assert status == "ok", theirs
    assert theirs == [7, 7, 7, 7]
    assert got.tolist() == [0, 1, 2, 3]
    assert their_view == "server0"
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) >= 2, refusals
    assert elapsed < 10


def test_mismatched_jobs_are_refused_at_the_handshake_on_both_sides(pki):
    listener = TcpListener("127.0.0.1", 0)
    results = SPAWN.Queue()
    other_job = {**JOB, "forget_set": digest([4])}
    peer = start(link_peers.server1, listener.port, str(pki), "run-1", other_job, results)
    try:
        with pytest.raises(SessionMismatchError, match="digest forget_set") as info:
            accept_server1(listener, pki)
        status, message, _ = results.get(timeout=20)
    finally:
        listener.close()
        stop(peer)
    assert set(info.value.differences) == {"digest forget_set"}
    assert status == "SessionMismatchError"
    assert "digest forget_set" in message
    assert "run_config" not in message


def test_killing_server1_stops_server0_with_a_clear_error(pki):
    listener = TcpListener("127.0.0.1", 0)
    results, linger = SPAWN.Queue(), SPAWN.Event()
    peer = start(link_peers.server1, listener.port, str(pki), "run-1", JOB, results, linger)
    try:
        link = accept_server1(listener, pki)
        link.transport.exchange(np.zeros(4, dtype=np.uint64))
        assert results.get(timeout=20)[0] == "ok"
        peer.kill()
        start_time = time.monotonic()
        with pytest.raises(PeerDisconnectedError, match="closed the connection|failed"):
            link.transport.recv()
        assert time.monotonic() - start_time < 2
    finally:
        listener.close()
        stop(peer)


def test_links_need_tls_or_an_explicit_insecure_flag():
    listener = TcpListener("127.0.0.1", 0)
    try:
        with pytest.raises(ConfigError, match="insecure=True"):
            Security()
        with pytest.raises(TypeError, match="security"):
            accept_peer(listener, role="server0", peer_role="server1")  # type: ignore[call-arg]
        with pytest.raises(TypeError, match="security"):
            connect_peer(listener.address, role="server1", peer_roles={"server0"})  # type: ignore[call-arg]
    finally:
        listener.close()


def test_plain_links_compare_sessions_too():
    listener = TcpListener("127.0.0.1", 0)
    out = {}

    def serve():
        try:
            out["link"] = accept_peer(
                listener,
                security=Security.plain(),
                role="server0",
                peer_role="server1",
                binding=SessionBinding("a"),
                limits=LinkLimits(accept_timeout_seconds=10),
            )
        except Exception as exc:  # checked below
            out["error"] = exc

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with pytest.raises(SessionMismatchError, match="session_id: ours 'b', theirs 'a'"):
            connect_peer(
                listener.address,
                security=Security.plain(),
                role="server1",
                peer_roles={"server0"},
                binding=SessionBinding("b"),
                limits=LinkLimits(timeout_seconds=10),
            )
        thread.join(10)
    finally:
        listener.close()
    assert isinstance(out.get("error"), SessionMismatchError)
