"""The dealer process under attack: third parties, wrong roles, junk, mismatches, crashes.

Issue 15 reproduced each of these on 127.0.0.1 against the old dealer: it served the first two
hellos (a connection with no credentials received party 1's seed and correction and locked the
real party out), one junk connection ended its session, and a frame declaring shape
(0, 2^64 - 1) crashed it. Every test runs the dealer as a real process and bounds every wait.
"""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import threading
import time

import link_peers
import numpy as np
import pytest

from fedunlearn.errors import (
    MalformedFrameError,
    PeerAuthenticationError,
    PeerDisconnectedError,
    SessionMismatchError,
)
from fedunlearn.mpc import (
    DealerOptions,
    Identity,
    LinkLimits,
    RemoteDealer,
    Security,
    SessionBinding,
    connect_peer,
    create_trial_pki,
    start_dealer_process,
)
from fedunlearn.mpc.dealer import Request

SPAWN = multiprocessing.get_context("spawn")
TIMEOUT = 20.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pki")
    create_trial_pki(directory)
    return directory


@pytest.fixture
def dealer(pki):
    handle = start_dealer_process(
        Security(identity=Identity.from_directory(pki, "dealer")),
        seed=7,
        options=DealerOptions(
            timeout_seconds=TIMEOUT, accept_timeout_seconds=30, handshake_timeout_seconds=1.0
        ),
    )
    yield handle
    handle.stop()


def impostor(pki, claimed_role):
    """The clients' certificate and key, presented by a process that claims another role."""
    clients = Identity.from_directory(pki, "clients")
    return Identity(clients.ca, clients.cert, clients.key, claimed_role)


def real_servers(address, pki, session="s"):
    """Both servers as processes: one triple each; return their reports."""
    results = SPAWN.Queue()
    processes = [
        SPAWN.Process(
            target=link_peers.dealer_party,
            args=(address, str(pki), k, session, results),
            daemon=True,
        )
        for k in (0, 1)
    ]
    for p in processes:
        p.start()
    try:
        return [results.get(timeout=TIMEOUT) for _ in processes]
    finally:
        for p in processes:
            p.join(10)
            if p.is_alive():
                p.kill()


def assert_valid_triples(reports):
    assert all(status == "ok" for status, _ in reports), reports
    shares = [np.array(values, dtype=np.uint64) for _, values in reports]
    a, b, c = shares[0] + shares[1]
    np.testing.assert_array_equal(c, a * b)


@pytest.mark.slow
def test_third_parties_and_client_certificates_get_nothing(pki, dealer):
    # Execute: no certificate, then a clients certificate claiming server 0, then server 1
    no_cert = link_peers.tls_without_certificate(dealer.address)
    errors = []
    for role in ("server0", "server1"):
        with pytest.raises(PeerAuthenticationError) as info:
            connect_peer(
                dealer.address,
                security=Security(identity=impostor(pki, role)),
                role=role,
                peer_roles={"dealer"},
                limits=LinkLimits(timeout_seconds=5),
            )
        errors.append(str(info.value))
    # ... and the real servers still get their material
    reports = real_servers(dealer.address, pki)
    # Assert
    assert "read b''" in no_cert or "Error" in no_cert  # the handshake failed; nothing came back
    assert all("certificate is for role 'clients'" in e for e in errors), errors
    assert_valid_triples(reports)
    assert dealer.join(TIMEOUT) == 0


@pytest.mark.slow
def test_a_client_certificate_cannot_take_a_server_seat_even_first(pki, dealer):
    # a client-role connection arrives first and stays; the real servers still join
    hold = threading.Thread(
        target=lambda: pytest.raises(
            PeerAuthenticationError,
            connect_peer,
            dealer.address,
            role="server1",
            peer_roles={"dealer"},
            security=Security(identity=impostor(pki, "server1")),
            limits=LinkLimits(timeout_seconds=5),
        )
    )
    hold.start()
    hold.join(10)
    assert_valid_triples(real_servers(dealer.address, pki))
    assert dealer.join(TIMEOUT) == 0


@pytest.mark.slow
def test_junk_and_oversized_frames_leave_the_dealer_running(pki, dealer):
    address = dealer.address
    junk = [
        threading.Thread(target=link_peers.junk_bytes, args=(address,)),
        threading.Thread(target=link_peers.oversized_header, args=(address,)),
        threading.Thread(target=link_peers.slow_drip, args=(address, 1.5)),
        threading.Thread(target=link_peers.silent, args=(address, 1.5)),
    ]
    for t in junk:
        t.start()
    time.sleep(0.3)  # the junk is there first
    reports = real_servers(address, pki)
    for t in junk:
        t.join(10)
    assert_valid_triples(reports)
    assert dealer.join(TIMEOUT) == 0


def test_mismatched_sessions_are_refused_by_the_dealer(pki, dealer):
    outcomes = {}

    def server(k, session):
        try:
            client = RemoteDealer.connect(
                *dealer.address,
                security=Security(identity=Identity.from_directory(pki, f"server{k}")),
                party_id=k,
                binding=SessionBinding(session),
                limits=LinkLimits(timeout_seconds=10),
            )
            client.triple((4,))
            outcomes[k] = "served"
        except Exception as exc:  # checked below
            outcomes[k] = exc

    threads = [threading.Thread(target=server, args=(k, s)) for k, s in ((0, "a"), (1, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert all(isinstance(e, SessionMismatchError) for e in outcomes.values()), outcomes
    assert all("session_id" in str(e) for e in outcomes.values())
    assert dealer.join(TIMEOUT) == 1


def test_killing_the_dealer_stops_streaming_servers_with_a_clear_error(pki, dealer):
    clients = [None, None]
    plan = [Request("triple", ((16,),))] * 2

    def join(k):
        clients[k] = RemoteDealer.connect(
            *dealer.address,
            security=Security(identity=Identity.from_directory(pki, f"server{k}")),
            party_id=k,
            limits=LinkLimits(timeout_seconds=10),
        )
        clients[k].plan(plan)
        assert clients[k].wait_prefetched(10)
        clients[k].triple((16,))

    threads = [threading.Thread(target=join, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    dealer.process.kill()
    dealer.join(TIMEOUT)
    start = time.monotonic()
    clients[0].triple((16,))  # streamed ahead: already here
    with pytest.raises(PeerDisconnectedError, match="dealer"):
        clients[0].zero((4,))  # not planned: needs the dealer
    assert time.monotonic() - start < 3
    for client in clients:
        client.close()


def test_an_impossible_shape_from_a_server_ends_the_session_cleanly(pki):
    # Prepare: the dealer from its command line (stderr captured), both servers in threads
    process = subprocess.Popen(
        [sys.executable, "-m", "fedunlearn.mpc.dealer_process", "--port", "0"]
        + ["--tls-dir", str(pki), "--timeout", "10"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        host, port = process.stdout.readline().rsplit(" ", 1)[1].strip().split(":")
        clients = [None, None]

        def join(k):
            clients[k] = RemoteDealer.connect(
                host,
                int(port),
                security=Security(identity=Identity.from_directory(pki, f"server{k}")),
                party_id=k,
                limits=LinkLimits(timeout_seconds=10),
            )

        threads = [threading.Thread(target=join, args=(k,)) for k in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        # Execute: server 0 asks for a triple of shape (0, 2^64 - 1)
        bad = np.array([2, 0, 0, 0, 1, 2, 0, 2**64 - 1], dtype=np.uint64)
        clients[0]._channel.send(bad)
        errors = []
        for client in clients:
            with pytest.raises((MalformedFrameError, PeerDisconnectedError)) as info:
                client.zero((1,))
            errors.append(info.value)
        code = process.wait(TIMEOUT)
        stderr = process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
        process.stdout.close()
        process.stderr.close()
    # Assert: a clean error at both servers and at the dealer, no crash
    assert isinstance(errors[0], MalformedFrameError)
    assert "2^40 elements" in str(errors[0])
    assert code == 1
    assert "MalformedFrameError" in stderr
    assert "Traceback" not in stderr
