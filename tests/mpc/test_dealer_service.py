"""The dealer as its own process: three-process runs, each party's view, mismatches, failures.

MPC2 in docs/mpc.md (the dealer is a trusted third party; it sends seeds and one correction share).
"""

from __future__ import annotations

import multiprocessing
import threading
import time

import dealer_peers
import numpy as np
import pytest

from fedunlearn.errors import (
    ConfigError,
    MalformedFrameError,
    PeerDisconnectedError,
    SecureComputationError,
    SessionMismatchError,
)
from fedunlearn.mpc import (
    Dealer,
    DealerOptions,
    DealerServer,
    InProcessTransport,
    LinkLimits,
    Party,
    RemoteDealer,
    Security,
    TcpListener,
    create_trial_pki,
    run_two_party,
    sec_mul,
    sec_share,
    start_dealer_process,
)
from fedunlearn.mpc.dealer import KINDS, Request, expand
from fedunlearn.mpc.dealer_wire import decode, encode_plan, encode_request

SPAWN = multiprocessing.get_context("spawn")
TIMEOUT = dealer_peers.TIMEOUT


@pytest.fixture
def dealer():
    """A dealer process on loopback with a fixed master seed; stopped after the test."""
    handle = start_dealer_process(
        Security.plain(),
        seed=dealer_peers.DEALER_SEED,
        options=DealerOptions(timeout_seconds=TIMEOUT),
    )
    yield handle
    handle.stop()
    assert not handle.process.is_alive()


def in_threads(*calls):
    """Run zero-argument callables in threads; return (results, errors) in order."""
    results, errors = [None] * len(calls), [None] * len(calls)

    def run(k):
        try:
            results[k] = calls[k]()
        except BaseException as exc:  # checked by the caller
            errors[k] = exc

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a dealer client hung"
    return results, errors


def clients(handle, timeout_seconds=TIMEOUT):
    return [
        RemoteDealer.connect(
            *handle.address,
            security=Security.plain(),
            party_id=k,
            limits=LinkLimits(timeout_seconds=timeout_seconds),
        )
        for k in (0, 1)
    ]


@pytest.mark.slow
def test_three_processes_compute_secmul_secge_secmi_with_the_remote_dealer(dealer):
    # Prepare: party 0 here, party 1 and the dealer in spawned processes, loopback
    listener = TcpListener("127.0.0.1", 0)
    results = SPAWN.Queue()
    peer = SPAWN.Process(
        target=dealer_peers.party_1, args=(listener.port, dealer.address, results), daemon=True
    )
    peer.start()
    try:
        transport = listener.accept(timeout_seconds=TIMEOUT)
        party = dealer_peers.connect_party(0, transport, dealer.address)
        frames0 = dealer_peers.record_frames(party.dealer)
        # Execute
        mine = dealer_peers.program(party)
        party.close()
        status, theirs, frames1 = results.get(timeout=TIMEOUT)
        exit_code = dealer.join(TIMEOUT)
    finally:
        listener.close()
        peer.join(timeout=10)
        if peer.is_alive():
            peer.kill()
    # Assert: correct results, identical to the simulated dealer with the same master seed
    assert status == "ok", theirs
    np.testing.assert_allclose(mine["product"], dealer_peers.X * dealer_peers.Y, atol=1e-3)
    np.testing.assert_array_equal(mine["ge"], (dealer_peers.X >= dealer_peers.Y).astype(float))
    np.testing.assert_allclose(mine["inverse"], np.linalg.inv(dealer_peers.M), atol=2e-3)
    expected0, expected1 = run_two_party(
        dealer_peers.program, dealer_seed=dealer_peers.DEALER_SEED, local_seed=3
    )
    for key in ("product", "ge", "inverse"):
        np.testing.assert_array_equal(mine[key], theirs[key])
        np.testing.assert_array_equal(mine[key], expected0[key])
    assert mine["counters"] == expected0["counters"]
    assert theirs["counters"] == expected1["counters"]
    # party 0 received one 16-byte seed per request and nothing else
    requests = mine["requests"]
    assert requests > 10
    assert len(frames0) == requests
    assert all(dtype == "|u1" and shape == (16,) for dtype, shape, _ in frames0)
    assert mine["counters"]["offline"]["bytes_received"] == 16 * requests
    # party 1 received its own seeds (never one of party 0's: no ZeroGen here) and corrections
    seeds0 = {payload for *_, payload in frames0}
    seeds1 = {payload for dtype, shape, payload in frames1 if shape == (16,)}
    assert len(seeds1) == requests
    assert seeds0.isdisjoint(seeds1)
    assert theirs["counters"]["offline"]["bytes_received"] > 16 * requests
    assert exit_code == 0  # both said goodbye, the dealer exited cleanly


def test_party_1_material_alone_does_not_reconstruct_a_triple(dealer):
    # Prepare
    d0, d1 = clients(dealer)
    frames0 = dealer_peers.record_frames(d0)
    frames1 = dealer_peers.record_frames(d1)
    shape = (256,)
    # Execute
    ((a0, b0, c0), (a1, b1, c1)), errors = in_threads(
        lambda: d0.triple(shape), lambda: d1.triple(shape)
    )
    d0.close()
    d1.close()
    # Assert: the shares make a triple, and each party's wire view is only its own material
    assert errors == [None, None]
    a, b, c = a0 + a1, b0 + b1, c0 + c1
    np.testing.assert_array_equal(c, a * b)
    assert [(dtype, shp) for dtype, shp, _ in frames0] == [("|u1", (16,))]
    assert [(dtype, shp) for dtype, shp, _ in frames1] == [("|u1", (16,)), ("<u8", shape)]
    seed0, seed1 = frames0[0][2], frames1[0][2]
    assert seed0 != seed1
    # party 1's seed expands to its own a1, b1 only; c1 is c minus party 0's pseudorandom c0
    request = Request("triple", (shape,))
    a1_again, b1_again, c1_again = expand(request, 1, seed1, [c1])
    np.testing.assert_array_equal(a1_again, a1)
    assert not np.any(a1 == a)
    assert not np.any(c1 == c)
    assert not np.any(c1 == a1 * b1)
    bits = np.unpackbits(c1.view(np.uint8))
    assert abs(bits.mean() - 0.5) < 0.02  # c1 looks uniform: it hides c without seed0
    assert dealer.join(TIMEOUT) == 0


def test_mismatched_requests_raise_at_both_parties(dealer):
    d0, d1 = clients(dealer)
    start = time.monotonic()
    _, errors = in_threads(lambda: d0.triple((4,)), lambda: d1.and_triple((4,)))
    assert all(isinstance(e, SecureComputationError) for e in errors), errors
    assert "do not match at request #0" in str(errors[0])
    assert "triple (4,)" in str(errors[1])
    assert "and (4,)" in str(errors[1])
    assert time.monotonic() - start < 5
    assert dealer.join(TIMEOUT) == 1  # the dealer stops: no silent wrong randomness


def test_different_shapes_or_a_party_that_stops_early_also_mismatch(dealer):
    d0, d1 = clients(dealer)
    _, errors = in_threads(lambda: d0.zero((4,)), lambda: d1.zero((4,)))
    assert errors == [None, None]
    d0.close()  # party 0 is done; party 1 still asks for more
    with pytest.raises(SecureComputationError, match="ended its session after 1 requests"):
        d1.triple((4,))
    assert dealer.join(TIMEOUT) == 1


def test_dealer_dying_mid_protocol_makes_both_parties_raise(dealer):
    # Prepare: party 1 in a child; both multiply once with the dealer alive
    listener = TcpListener("127.0.0.1", 0)
    results, go = SPAWN.Queue(), SPAWN.Event()
    peer = SPAWN.Process(
        target=dealer_peers.party_1_until_dealer_dies,
        args=(listener.port, dealer.address, results, go),
        daemon=True,
    )
    peer.start()
    try:
        transport = listener.accept(timeout_seconds=TIMEOUT)
        party = dealer_peers.connect_party(0, transport, dealer.address)
        x = sec_share(party, np.arange(5.0), owner=0)
        np.testing.assert_allclose(sec_mul(x, x).reveal(), np.arange(5.0) ** 2, atol=1e-3)
        assert results.get(timeout=TIMEOUT) == "first product done"
        # Execute: kill the dealer, then both ask it for another triple
        dealer.process.kill()
        dealer.join(TIMEOUT)
        go.set()
        start = time.monotonic()
        with pytest.raises(PeerDisconnectedError, match="dealer"):
            sec_mul(x, x)
        elapsed = time.monotonic() - start
        theirs = results.get(timeout=TIMEOUT)
        party.close()
    finally:
        listener.close()
        peer.join(timeout=10)
        if peer.is_alive():
            peer.kill()
    # Assert: both raised promptly (well inside the 20 s timeout), nobody hung
    assert theirs == "PeerDisconnectedError"
    assert elapsed < 5


@pytest.mark.slow
def test_a_silent_dealer_times_out():
    listener = TcpListener("127.0.0.1", 0)  # accepts, then never answers the hello
    try:
        accepted = []
        thread = threading.Thread(
            target=lambda: accepted.append(listener.accept(timeout_seconds=5))
        )
        thread.start()
        start = time.monotonic()
        with pytest.raises(PeerDisconnectedError, match="sent nothing"):
            RemoteDealer.connect(
                "127.0.0.1",
                listener.port,
                security=Security.plain(),
                party_id=0,
                # the timeout is also the join window: a silent listener may be a late one
                limits=LinkLimits(timeout_seconds=1.5, handshake_timeout_seconds=0.3),
            )
        assert time.monotonic() - start < 4
        thread.join(5)
    finally:
        listener.close()
        for t in accepted:
            t.close()


def serve_in_thread(**kwargs):
    options = DealerOptions(timeout_seconds=5, **kwargs)
    server = DealerServer(Security.plain(), seed=1, options=options)
    outcome = []

    def run():
        try:
            outcome.append(server.serve())
        except BaseException as exc:  # checked by the test
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return server, thread, outcome


def test_oversized_requests_and_wrong_mask_settings_are_rejected():
    server, thread, outcome = serve_in_thread(max_frame_bytes=1 << 12)
    d0, d1 = (
        RemoteDealer.connect(
            *server.address,
            security=Security.plain(),
            party_id=k,
            limits=LinkLimits(timeout_seconds=5),
        )
        for k in (0, 1)
    )
    _, errors = in_threads(lambda: d0.triple((1000,)), lambda: d1.triple((1000,)))
    thread.join(10)
    assert all(isinstance(e, MalformedFrameError) for e in errors), errors
    assert "max_frame_bytes" in str(errors[0])
    assert isinstance(outcome[0], MalformedFrameError)

    server, thread, outcome = serve_in_thread(mask_scale_bits=3)
    with pytest.raises(SessionMismatchError, match="option mask_scale_bits: ours 2, theirs 3"):
        RemoteDealer.connect(
            *server.address,
            security=Security.plain(),
            party_id=0,
            limits=LinkLimits(timeout_seconds=5),
        )
    thread.join(10)
    assert isinstance(outcome[0], SessionMismatchError)
    assert "master" not in repr(server)


@pytest.mark.parametrize(
    "request_",
    [
        Request("triple", ((3, 4),)),
        Request("matrix", ((2, 3), (3, 5))),
        Request("inner", ((4, 7),)),
        Request("mask", ((2, 3, 3),), frac_bits=13),
        Request("and2", ((0,),)),
    ],
    ids=str,
)
def test_requests_and_plans_survive_the_wire(request_):
    message = decode(encode_request(17, request_), party_id=0)
    assert (message.kind, message.index, message.request) == ("request", 17, request_)
    plan = decode(encode_plan(3, 17, [request_, request_]), party_id=0)
    assert (plan.kind, plan.plan_id, plan.index, plan.plan) == ("plan", 3, 17, (request_,) * 2)


@pytest.mark.parametrize(
    "words",
    [
        [2, 0, len(KINDS), 0, 1, 1, 4],
        [2, 0, 0, 0, 1, 3, 4],
        [2, 0, 1, 0, 1, 1, 4],
        [9, 0],
        [4, 1, 0, 2, 0, 0, 1, 1, 4],
        [4, 1, 0, 10**9],
        [2, 0, 0, 0, 1, 2, 0, 2**64 - 1],
    ],
    ids=[
        "unknown-kind",
        "short-shape",
        "matrix-needs-two",
        "bad-tag",
        "plan-too-short",
        "plan-too-long",
        "huge-dimension",
    ],
)
def test_malformed_requests_are_rejected(words):
    with pytest.raises(MalformedFrameError, match="party 1 sent the dealer"):
        decode(np.array(words, dtype=np.uint64), party_id=1)


def test_party_takes_exactly_one_dealer_of_its_own_party_id():
    t0, _ = InProcessTransport.pair()
    with pytest.raises(ConfigError, match="exactly one of dealer_seed"):
        Party(0, t0)
    with pytest.raises(ConfigError, match="exactly one of dealer_seed"):
        Party(0, t0, 3, dealer=Dealer(3, 0))
    with pytest.raises(ConfigError, match="serves party 1"):
        Party(0, t0, dealer=Dealer(3, 1))
    party = Party(0, t0, dealer=Dealer(3, 0))
    party.dealer.triple((2,))
    assert party.counters.offline.bytes_received == 16


def test_remote_dealer_over_mutual_tls_with_roles(tmp_path):
    # Prepare: a dealer process with its trial certificate; each server with its own
    import ssl

    pki = create_trial_pki(tmp_path / "pki")
    dealer = Security(identity=pki["dealer"])
    with start_dealer_process(dealer, seed=5) as handle:
        d0, d1 = (
            RemoteDealer.connect(
                *handle.address, party_id=k, security=Security(identity=pki[f"server{k}"])
            )
            for k in (0, 1)
        )
        # Execute
        ((a0, b0, c0), (a1, b1, c1)), errors = in_threads(
            lambda: d0.triple((8,)), lambda: d1.triple((8,))
        )
        d0.close()
        d1.close()
        # Assert
        assert errors == [None, None]
        assert isinstance(d0.transport._sock, ssl.SSLSocket)
        assert d0.link.authenticated
        assert d0.link.role == "dealer"
        np.testing.assert_array_equal(c0 + c1, (a0 + a1) * (b0 + b1))
        assert handle.join(TIMEOUT) == 0


def test_plain_tcp_is_never_implicit():
    # Issue 20: the dealer, its clients and the links used to fall back to plain TCP when
    # given no security (a "legacy" mode); now security is a required, explicit choice.
    with pytest.raises(ConfigError, match="insecure=True"):
        Security()
    with pytest.raises(ConfigError, match=r"Security\.plain\(\)"):
        DealerServer(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="security"):
        RemoteDealer.connect("127.0.0.1", 1, party_id=0)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="security"):
        start_dealer_process()  # type: ignore[call-arg]
    server = DealerServer(Security.plain())
    try:
        assert server.security.startswith("plain TCP (insecure)")
        assert "implicit" not in server.security
    finally:
        server.close()


def test_dealer_runs_from_the_command_line():
    import subprocess
    import sys

    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fedunlearn.mpc.dealer_process",
            "--port",
            "0",
            "--seed",
            "4",
            "--insecure",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()
        host, port = line.rsplit(" ", 1)[1].strip().split(":")
        d0, d1 = (
            RemoteDealer.connect(host, int(port), security=Security.plain(), party_id=k)
            for k in (0, 1)
        )
        (r0, r1), errors = in_threads(lambda: d0.zero((3,)), lambda: d1.zero((3,)))
        d0.close()
        d1.close()
        assert errors == [None, None]
        np.testing.assert_array_equal(r0 + r1, np.zeros(3, np.uint64))
        assert process.wait(TIMEOUT) == 0
        assert "served 1 requests" in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
        process.stdout.close()
